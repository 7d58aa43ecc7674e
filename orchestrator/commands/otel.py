"""``crosshost export otel``: a run as OTLP traces following the OpenTelemetry GenAI conventions.

One trace per attempt: an ``invoke_agent`` span (the root), a ``chat`` child per model request the
trace records and an ``execute_tool`` child per tool call, with ``crosshost.*`` attributes for the
host facts and a ``gen_ai.evaluation.result`` event carrying the attempt's verdict. The spans are
built by the OpenTelemetry SDK and sent by its OTLP/HTTP exporter (``--endpoint``), or encoded by
the SDK's OTLP encoder and written as OTLP/JSON lines (``--file``).

The run directory holds durations, not clock times: each host's attempts are laid end to end from
the run's start, in the order the runner ran them, and each span lasts what the trace recorded.
Every string attribute passes the runner's redaction once more, so a secret-shaped value never
leaves the controller even from a trace written by an older runner.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from agent_runner.model_records import CallRecord, call_record_of
from agent_runner.records import TraceFinish, TraceHeader, TraceTurn
from agent_runner.redact import redact, redact_text
from agent_runner.trace import iter_trace
from orchestrator.errors import ExportFailed, InputError, TraceError
from orchestrator.store.rundir import RunDir, parse_utc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

# The GenAI semantic conventions these spans follow (status: development), and their schema URL.
SEMCONV_VERSION = "1.38.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = "crosshost"
EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "crosshost.verdict"
MAX_ATTRIBUTE = 4_000  # characters of one string attribute
EXPORT_BATCH = 512  # spans per OTLP request
EXPORT_TIMEOUT_S = 10.0

_SCORES = {"pass": 1.0, "fail": 0.0}


@dataclass
class ExportSummary:
    attempts: int = 0
    spans: int = 0
    requests: int = 0
    destination: str = ""
    skipped: list[str] = field(default_factory=list)


def _require_sdk() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise InputError(
            f"the OpenTelemetry export needs the 'otel' extra ({exc.name} is missing): "
            "pip install 'crosshost[otel]'"
        ) from None


# --- attributes -----------------------------------------------------------------------------------


def _text(value: object) -> str:
    text = redact_text(value if isinstance(value, str) else json.dumps(redact(value), sort_keys=True))
    return text if len(text) <= MAX_ATTRIBUTE else text[:MAX_ATTRIBUTE] + "…"


#: an attribute value as the export sets it (a subset of what OTel takes)
Attribute = bool | int | float | str | list[str]


def _attrs(raw: Mapping[str, object]) -> dict[str, Attribute]:
    """OTel attributes: None dropped, strings redacted and cut, other values as OTel takes them."""
    out: dict[str, Attribute] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float):
            out[key] = value
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            out[key] = [_text(v) for v in value]
        else:
            out[key] = _text(value)
    return out


def endpoint_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: a bare ``http://host:4318`` gets ``/v1/traces`` appended."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(
            f"--endpoint {endpoint!r}: give an http(s) URL, e.g. http://127.0.0.1:4318/v1/traces"
        )
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/traces")
    return urlunsplit(parts)


# --- the run, as the export reads it --------------------------------------------------------------


@dataclass
class _Attempt:
    host: str
    task: str
    attempt: int
    path: Path


def _iso_ns(value: object) -> int | None:
    when = parse_utc(value)
    return None if when is None else int(when.timestamp() * 1e9)


def _read_trace(path: Path) -> tuple[TraceHeader | None, list[TraceTurn], TraceFinish]:
    """The attempt's header, turns and finish; a trace cut short finishes with nothing said."""
    header: TraceHeader | None = None
    turns: list[TraceTurn] = []
    finish = TraceFinish(reason="", final="", predicate_exit=None, verdict="", why="", wall_ms=0)
    for _, record in iter_trace(path):
        if isinstance(record, TraceHeader):
            header = record
        elif isinstance(record, TraceTurn):
            turns.append(record)
        elif isinstance(record, TraceFinish):
            finish = record
    return header, turns, finish


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ms(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class _Chat:
    """One model request of an attempt: the record the runner kept and the tokens it used."""

    record: CallRecord
    input_tokens: int | None = None
    output_tokens: int | None = None
    turn_step: int | None = None  # the first tool call this request produced


def _chats(turns: Sequence[TraceTurn], finish: TraceFinish) -> list[_Chat]:
    """The model requests: finish.model.calls in order, tokens from the turn that carried each one;
    a request that made no tool call (the final answer) gets what the totals leave over."""
    model = _obj(finish.extra.get("model"))
    calls = model.get("calls")
    by_request: dict[Any, TraceTurn] = {}
    for turn in turns:
        if turn.model is not None and turn.model.get("request") is not None:
            by_request.setdefault(turn.model["request"], turn)
    chats: list[_Chat] = []
    records = (
        [r for r in map(call_record_of, calls) if r is not None]
        if isinstance(calls, list)
        else [t.model for t in by_request.values() if t.model is not None]
    )
    for call in records:
        carrier = by_request.get(call.get("request"))
        chat = _Chat(call)
        if carrier is not None:
            chat.input_tokens = _ms(carrier.prompt_tokens)
            chat.output_tokens = _ms(carrier.completion_tokens)
            chat.turn_step = carrier.step or None
        chats.append(chat)
    totals = (_ms(model.get("prompt_tokens")), _ms(model.get("completion_tokens")))
    untold = [c for c in chats if c.input_tokens is None]
    if len(untold) == 1:
        told_in = sum(c.input_tokens or 0 for c in chats)
        told_out = sum(c.output_tokens or 0 for c in chats)
        untold[0].input_tokens = max(0, totals[0] - told_in)
        untold[0].output_tokens = max(0, totals[1] - told_out)
    return chats


# --- building the spans ---------------------------------------------------------------------------


class _Collector:
    """Keeps ended spans until they are sent in batches (the SDK's processor hooks feed it)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []


def _processor(collector: _Collector) -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class Collecting(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            collector.spans.append(span)

    return Collecting()


@contextmanager
def _quiet_sdk_logs() -> Iterator[None]:
    """The SDK logs export failures with tracebacks; the command says them in one line instead."""
    logger = logging.getLogger("opentelemetry")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.CRITICAL + 1)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.propagate = propagate


class _Emitter:
    def __init__(self, tracer: Tracer, run: Mapping[str, Any], with_content: bool) -> None:
        self.tracer = tracer
        self.run = run
        self.with_content = with_content

    def attempt(
        self, a: _Attempt, start_ns: int, task_info: Mapping[str, Any], host_info: Mapping[str, Any]
    ) -> int:
        """Emit one attempt's spans from ``start_ns``; returns when the attempt ended."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        header, turns, finish = _read_trace(a.path)
        chats = _chats(turns, finish)
        agent = header.agent if header is not None else None
        model = _obj(finish.extra.get("model"))
        settings = _obj(model.get("settings"))
        # an exec agent's wire format names its provider (gen_ai.provider.name: openai, anthropic)
        provider = "openai" if agent == "openai" else settings.get("api") if agent == "exec" else None
        provider = provider if isinstance(provider, str) else None
        verdict = str(
            finish.verdict or task_info["verdicts"].get(a.host, ["error"] * (a.attempt + 1))[a.attempt]
        )
        wall = _ms(finish.wall_ms) or sum(_ms(t.latency_ms) for t in turns)
        end_ns = start_ns + max(wall, 1) * 1_000_000
        flipped = a.attempt in task_info["flipped_attempts"].get(a.host, [])
        root_attrs = _attrs(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": settings.get("model"),
                "gen_ai.request.temperature": settings.get("temperature"),
                "gen_ai.request.seed": settings.get("seed"),
                "gen_ai.usage.input_tokens": _ms(model.get("prompt_tokens")) if model else None,
                "gen_ai.usage.output_tokens": _ms(model.get("completion_tokens")) if model else None,
                "crosshost.run_id": self.run["run_id"],
                "crosshost.suite": self.run["suite"],
                "crosshost.host": a.host,
                "crosshost.host.reference": a.host == self.run["reference"],
                "crosshost.fingerprint": host_info.get("fingerprint") or (header.fingerprint if header else None),
                "crosshost.task": a.task,
                "crosshost.attempt": a.attempt,
                "crosshost.verdict": verdict,
                "crosshost.classification": task_info["classification"],
                "crosshost.action": task_info["action"],
                "crosshost.flip": task_info["flip"],
                "crosshost.flipped": flipped,
                "crosshost.finish_reason": finish.reason or None,
                "crosshost.predicate_exit": finish.predicate_exit,
                "crosshost.steps": len(turns),
                "crosshost.trace_path": f"hosts/{a.host}/traces/{a.path.name}",
            }
        )
        root = self.tracer.start_span(
            f"invoke_agent {agent}" if agent else "invoke_agent",
            kind=SpanKind.INTERNAL,
            attributes=root_attrs,
            start_time=start_ns,
        )
        from opentelemetry import trace as _trace

        ctx = _trace.set_span_in_context(root)
        clock = start_ns
        chats_by_step = {c.turn_step: c for c in chats if c.turn_step is not None}
        for turn in turns:
            chat = chats_by_step.pop(turn.step, None)
            if chat is not None:
                clock = self._chat(chat, ctx, clock, provider, settings)
            clock = self._tool(turn, ctx, clock, chat)
        for chat in chats:  # requests that made no tool call: the final answer, a refused request
            if chat.turn_step is None:
                clock = self._chat(chat, ctx, clock, provider, settings)
        root.add_event(
            EVALUATION_EVENT,
            attributes=_attrs(
                {
                    "gen_ai.evaluation.name": EVALUATION_NAME,
                    "gen_ai.evaluation.score.label": verdict,
                    "gen_ai.evaluation.score.value": _SCORES.get(verdict),
                    "gen_ai.evaluation.explanation": finish.why or None,
                    "crosshost.classification": task_info["classification"],
                    "crosshost.flipped": flipped,
                }
            ),
            timestamp=max(end_ns, clock),
        )
        if verdict == "error":
            root.set_attribute("error.type", "crosshost.error_verdict")
            root.set_status(Status(StatusCode.ERROR, _text(finish.why or "error verdict")))
        root.end(end_time=max(end_ns, clock))
        return max(end_ns, clock)

    def _chat(
        self, chat: _Chat, ctx: Any, start: int, provider: str | None, settings: Mapping[str, Any]
    ) -> int:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        record = chat.record
        took = sum(_ms(x.get("latency_ms")) for x in record.get("attempts", []))
        requested = settings.get("model")
        model = requested if isinstance(requested, str) else record.get("model")
        finish_reason = record.get("finish_reason")
        span = self.tracer.start_span(
            f"chat {model}" if model else "chat",
            context=ctx,
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes=_attrs(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": provider,
                    "gen_ai.request.model": model,
                    "gen_ai.request.temperature": settings.get("temperature"),
                    "gen_ai.request.seed": settings.get("seed"),
                    "gen_ai.response.model": record.get("model"),
                    "gen_ai.response.id": record.get("request"),
                    "gen_ai.response.finish_reasons": [finish_reason]
                    if isinstance(finish_reason, str)
                    else None,
                    "gen_ai.usage.input_tokens": chat.input_tokens,
                    "gen_ai.usage.output_tokens": chat.output_tokens,
                    "openai.response.system_fingerprint": record.get("system_fingerprint"),
                    "http.response.status_code": record.get("status")
                    if isinstance(record.get("status"), int)
                    else None,
                    "crosshost.model.retries": _ms(record.get("retries")),
                }
            ),
        )
        if record.get("error"):
            span.set_attribute("error.type", "crosshost.model_error")
            span.set_status(Status(StatusCode.ERROR, _text(record.get("message") or record["error"])))
        end = start + max(took, 1) * 1_000_000
        span.end(end_time=end)
        return end

    def _tool(self, turn: TraceTurn, ctx: Any, start: int, chat: _Chat | None) -> int:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        tool = turn.tool
        took = _ms(turn.latency_ms)
        if chat is not None:  # the turn's latency holds the model request as well
            took -= sum(_ms(x.get("latency_ms")) for x in chat.record.get("attempts", []))
        attrs: dict[str, object] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.type": "function",
            "crosshost.step": turn.step or None,
            "crosshost.args_fp": turn.args_fp or None,
            "crosshost.obs_fp": turn.obs_fp or None,
        }
        if self.with_content:
            attrs["gen_ai.tool.call.arguments"] = turn.args
        span = self.tracer.start_span(
            f"execute_tool {tool}",
            context=ctx,
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes=_attrs(attrs),
        )
        if turn.error:
            span.set_attribute("error.type", "crosshost.tool_error")
            span.set_status(Status(StatusCode.ERROR, _text(turn.error)))
        end = start + max(took, 1) * 1_000_000
        span.end(end_time=end)
        return end


# --- the OTLP/JSON file ---------------------------------------------------------------------------


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _ids(obj: Any, convert: Any) -> Any:
    """Rewrite trace and span ids throughout an OTLP/JSON object (hex in the file, base64 in protobuf JSON)."""
    if isinstance(obj, dict):
        return {
            k: convert(v) if k in _ID_FIELDS and isinstance(v, str) else _ids(v, convert)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_ids(v, convert) for v in obj]
    return obj


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex() if value else ""


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode() if value else ""


class OtlpJsonLinesExporter:
    """A span exporter writing one ``ExportTraceServiceRequest`` per line in OTLP/JSON (the
    encoding the OpenTelemetry Collector's file exporter writes): lowerCamelCase fields, enums as
    numbers, trace and span ids as hex."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle

    def export(self, spans: Sequence[ReadableSpan]) -> Any:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
        self.handle.write(json.dumps(_ids(message, _b64_to_hex), separators=(",", ":")) + "\n")
        self.handle.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def read_otlp_json_lines(path: Path) -> list[Any]:
    """The ``ExportTraceServiceRequest`` messages of an OTLP/JSON lines file, as protobuf objects."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(ParseDict(_ids(json.loads(line), _hex_to_b64), ExportTraceServiceRequest()))
        except Exception as exc:  # noqa: BLE001 (protobuf raises several kinds; all mean the same)
            raise InputError(f"{path}:{number}: not an OTLP/JSON trace request: {exc}") from None
    return out


# --- the command ----------------------------------------------------------------------------------


def _provider() -> tuple[TracerProvider, Tracer, _Collector]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from orchestrator import __version__

    resource = Resource.create(
        {"service.name": "crosshost", "service.version": __version__}, schema_url=SCHEMA_URL
    )
    provider = TracerProvider(resource=resource)
    collector = _Collector()
    provider.add_span_processor(_processor(collector))
    tracer = provider.get_tracer(SCOPE, __version__, schema_url=SCHEMA_URL)
    return provider, tracer, collector


def export_run(
    run_dir: Path, *, endpoint: str | None = None, file: Path | None = None, with_content: bool = False
) -> ExportSummary:
    """Analyse ``run_dir`` and send every attempt's spans to ``endpoint`` or append them to ``file``."""
    from orchestrator.analysis import analyse_run
    from orchestrator.analysis.flips import flipped_attempts

    if (endpoint is None) == (file is None):
        raise InputError("export otel: give exactly one of --endpoint URL or --file PATH")
    url = endpoint_url(endpoint) if endpoint is not None else None
    _require_sdk()
    report = analyse_run(run_dir)
    rundir = RunDir(run_dir)
    manifest_started = _iso_ns(rundir.read_manifest().started)
    hosts = report.host_names()
    reference = report.reference or (hosts[0] if hosts else "")
    run = {"run_id": report.run_id, "suite": report.suite, "reference": reference}
    host_info = {h.name: {"fingerprint": h.fingerprint} for h in report.hosts}
    provider, tracer, collector = _provider()
    emitter = _Emitter(tracer, run, with_content)
    summary = ExportSummary(destination=url or str(file))

    exporter: SpanExporter | OtlpJsonLinesExporter
    handle: IO[str] | None = None
    if url is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S)
    else:
        assert file is not None
        try:
            handle = open(file, "a", encoding="utf-8")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise InputError(f"--file {file}: cannot write: {exc.strerror or exc}") from None
        exporter = OtlpJsonLinesExporter(handle)

    def send(final: bool = False) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while len(collector.spans) >= EXPORT_BATCH or (final and collector.spans):
            batch, collector.spans[:] = collector.spans[:EXPORT_BATCH], collector.spans[EXPORT_BATCH:]
            with _quiet_sdk_logs():
                result = exporter.export(batch)
            summary.requests += 1
            if result is not SpanExportResult.SUCCESS:
                raise ExportFailed(
                    summary.destination,
                    f"the OTLP receiver did not take {len(batch)} span(s) ({summary.spans} sent before); "
                    "is it running and does it accept OTLP/HTTP protobuf?",
                )
            summary.spans += len(batch)

    files = dict(rundir.trace_files())
    clock = {h: manifest_started or _iso_ns(_dt.datetime.now(_dt.UTC).isoformat()) or 0 for h in hosts}
    try:
        for task in report.tasks:
            task_info = {
                "verdicts": task.verdicts,
                "classification": task.classification,
                "action": task.action,
                "flip": task.flip,
                "flipped_attempts": {h: flipped_attempts(task, h, reference) for h in hosts},
            }
            for host in hosts:
                for attempt in range(len(task.verdicts.get(host, []))):
                    path = files.get((host, task.task, attempt))
                    if path is None:
                        summary.skipped.append(f"{host} {task.task} attempt {attempt}: no trace")
                        continue
                    try:
                        clock[host] = emitter.attempt(
                            _Attempt(host, task.task, attempt, path),
                            clock[host],
                            task_info,
                            host_info.get(host, {}),
                        )
                    except (TraceError, OSError) as exc:
                        summary.skipped.append(f"{host} {task.task} attempt {attempt}: {exc}")
                        continue
                    summary.attempts += 1
            send()
        send(final=True)
    finally:
        exporter.shutdown()
        provider.shutdown()
        if handle is not None:
            handle.close()
    return summary

