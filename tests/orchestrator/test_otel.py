"""``crosshost export otel``: a run's attempts as GenAI spans, sent to a real OTLP/HTTP receiver
started here (decoded with opentelemetry-proto's own classes) and written as OTLP/JSON lines."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from typer.testing import CliRunner

from agent_runner.records import TraceFinish, TraceHeader, TraceTurn
from agent_runner.redact import redact_text
from agent_runner.trace import fp
from orchestrator.cli import app
from orchestrator.commands.otel import SCHEMA_URL, read_otlp_json_lines
from tests.support.html_run import build_known_run
from tests.support.rundirs import PINS, Attempt

SECRETS = (
    "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "AKIAABCDEFGHIJKLMNOP",
)


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, protobuf out."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        received = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                received.paths.append(self.path)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                received.requests.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[dict[str, Any]]:
        return [s for r in self.requests for s in flatten(r)]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def flatten(request: ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    """Each span as a dict: name, ids, attributes, events, and its resource's and scope's schema."""
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "name": s.name,
                    "trace": s.trace_id.hex(),
                    "id": s.span_id.hex(),
                    "parent": s.parent_span_id.hex(),
                    "attrs": {a.key: _value(a.value) for a in s.attributes},
                    "events": [(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events],
                    "status": s.status.code,
                    "resource": resource,
                    "resource_schema": rs.schema_url,
                    "scope": (ss.scope.name, ss.schema_url),
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                }


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
        r.thread.join(timeout=5)


def _openai_attempt(run_id: str, host: str, verdict: str) -> Attempt:
    """An attempt of the built-in openai agent as its trace records it: two model requests, the
    first asking for two tool calls, the second giving the final answer; secrets where an older
    runner might have left them."""
    request = {
        "request": f"req-1-{host}", "status": 200, "retries": 1, "model": "gpt-test-2025",
        "system_fingerprint": "fp_abc", "finish_reason": "tool_calls",
        "attempts": [{"status": 429, "latency_ms": 40, "error": "rate limited", "wait_s": 0.1},
                     {"status": 200, "latency_ms": 60, "error": None, "wait_s": None}],
    }  # fmt: skip
    final = dict(request, request=f"req-2-{host}", retries=0, finish_reason="stop",
                 attempts=[{"status": 200, "latency_ms": 30, "error": None, "wait_s": None}])  # fmt: skip
    args1 = {"unit": "nginx.service", "api_key": SECRETS[0], "note": f"token {SECRETS[1]}"}
    args2 = {"url": "http://127.0.0.1:9/health"}
    lines = [
        TraceHeader(run_id=run_id, host=host, task="model-task", attempt=0, fingerprint="f" * 16, pins=PINS,
                    agent="openai").to_json(),
        TraceTurn(step=1, tool="read_unit_status", args=args1, args_fp=fp(args1), obs_fp=fp("ok"),
                  prompt_tokens=120, completion_tokens=30, latency_ms=150, model=request).to_json(),
        TraceTurn(step=2, tool="http_get_health", args=args2, args_fp=fp(args2), obs_fp=fp("ok"),
                  error=f"refused ({SECRETS[2]})", latency_ms=20).to_json(),
        TraceFinish(reason="stop", final=f"done, key {SECRETS[0]}", predicate_exit=0 if verdict == "pass" else 1,
                    verdict=verdict, why=f"predicate said {SECRETS[1]}", wall_ms=400, steps=2, findings=[],
                    extra={"model": {"settings": {"model": "gpt-test", "temperature": 0.0, "seed": 7},
                                     "requests": 2, "retries": 1, "prompt_tokens": 300, "completion_tokens": 42,
                                     "calls": [request, final]}}).to_json(),
    ]  # fmt: skip
    return Attempt(verdict, raw_lines=[json.dumps(line) for line in lines])


def _run(tmp_path: Path) -> Path:
    run_id = "20250101T000000Z-abcdef"
    extra = {
        ("local", "model-task", 0): _openai_attempt(run_id, "local", "pass"),
        ("box-b", "model-task", 0): _openai_attempt(run_id, "box-b", "fail"),
        ("box-c", "model-task", 0): _openai_attempt(run_id, "box-c", "pass"),
    }
    return build_known_run(tmp_path, run_id, extra_attempts=extra)


def _all_strings(span: dict[str, Any]) -> Iterator[str]:
    values: list[Any] = [*span["attrs"].values(), *span["resource"].values(), span["name"]]
    for _, attrs in span["events"]:
        values += attrs.values()
    for v in values:
        if isinstance(v, list):
            yield from (x for x in v if isinstance(x, str))
        elif isinstance(v, str):
            yield v


def test_spans_arrive_at_a_real_otlp_receiver_with_genai_and_crosshost_attributes(tmp_path, receiver):
    run = _run(tmp_path)
    result = CliRunner().invoke(app, ["export", "otel", str(run), "--endpoint", receiver.url, "--content"])
    assert result.exit_code == 0, result.output
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}  # a bare endpoint gets the path
    spans = receiver.spans()
    roots = [s for s in spans if s["attrs"].get("gen_ai.operation.name") == "invoke_agent"]
    # 4 tasks x 3 hosts, 2 attempts each except model-task's 1: one invoke_agent span per attempt
    assert len(roots) == 3 * 2 * 3 + 3
    assert all(s["parent"] == "" for s in roots) and len({s["trace"] for s in roots}) == len(roots)
    assert f"exported {len(spans)} span(s) of {len(roots)} attempt(s)" in result.output

    flip = next(s for s in roots if s["attrs"]["crosshost.task"] == "flip-task" and s["attrs"]["crosshost.host"] == "box-b"
                and s["attrs"]["crosshost.attempt"] == 0)  # fmt: skip
    a = flip["attrs"]
    assert a["crosshost.verdict"] == "fail" and a["crosshost.classification"] == "host_coupling"
    assert a["crosshost.fingerprint"] == "b" * 16 and a["crosshost.flipped"] is True
    assert a["crosshost.run_id"] == "20250101T000000Z-abcdef" and a["crosshost.host.reference"] is False
    assert flip["events"] == [
        (
            "gen_ai.evaluation.result",
            {
                "gen_ai.evaluation.name": "crosshost.verdict",
                "gen_ai.evaluation.score.label": "fail",
                "gen_ai.evaluation.score.value": 0.0,
                "gen_ai.evaluation.explanation": "predicate exit 1: nginx still unhealthy",
                "crosshost.classification": "host_coupling",
                "crosshost.flipped": True,
            },
        )
    ]
    tools = [s for s in spans if s["parent"] == flip["id"]]
    assert [s["name"] for s in tools] == [
        "execute_tool read_unit_status", "execute_tool http_get_health", "execute_tool restart_unit",
    ]  # fmt: skip
    assert tools[1]["attrs"]["gen_ai.tool.call.arguments"] == '{"url": "http://127.0.0.1:9/health"}'
    assert all(s["resource_schema"] == SCHEMA_URL and s["scope"] == ("crosshost", SCHEMA_URL) for s in spans)
    assert flip["resource"]["service.name"] == "crosshost"

    # the openai agent's attempt: one chat span per model request, tokens where the trace has them
    model_root = next(
        s
        for s in roots
        if s["attrs"]["crosshost.task"] == "model-task" and s["attrs"]["crosshost.host"] == "box-b"
    )
    assert model_root["name"] == "invoke_agent openai"
    assert model_root["attrs"]["gen_ai.provider.name"] == "openai"
    assert model_root["attrs"]["gen_ai.usage.input_tokens"] == 300
    children = sorted((s for s in spans if s["parent"] == model_root["id"]), key=lambda s: s["start"])
    assert [s["name"] for s in children] == [
        "chat gpt-test", "execute_tool read_unit_status", "execute_tool http_get_health", "chat gpt-test",
    ]  # fmt: skip
    chat1, chat2 = children[0]["attrs"], children[3]["attrs"]
    assert chat1["gen_ai.operation.name"] == "chat" and chat1["gen_ai.request.model"] == "gpt-test"
    assert chat1["gen_ai.response.model"] == "gpt-test-2025" and chat1["gen_ai.response.id"] == "req-1-box-b"
    assert (chat1["gen_ai.usage.input_tokens"], chat1["gen_ai.usage.output_tokens"]) == (120, 30)
    assert (chat2["gen_ai.usage.input_tokens"], chat2["gen_ai.usage.output_tokens"]) == (180, 12)  # the rest
    assert chat1["gen_ai.response.finish_reasons"] == ["tool_calls"] and chat1["gen_ai.request.seed"] == 7
    assert children[2]["status"] == 2  # the tool call that failed: ERROR
    assert all(s["start"] <= c["start"] <= c["end"] <= s["end"] for s in [model_root] for c in children)

    # no secret-shaped value anywhere, though the trace held three (and --content sends arguments)
    for span in spans:
        for text in _all_strings(span):
            assert redact_text(text) == text, (span["name"], text)
            assert not any(secret in text for secret in SECRETS)
    args = json.loads(children[1]["attrs"]["gen_ai.tool.call.arguments"])
    assert args["api_key"] == "[REDACTED]" and args["unit"] == "nginx.service"


def test_without_content_no_arguments_are_sent(tmp_path, receiver):
    run = _run(tmp_path)
    assert (
        CliRunner()
        .invoke(app, ["export", "otel", str(run), "--endpoint", receiver.url + "/v1/traces"])
        .exit_code
        == 0
    )
    assert not any("gen_ai.tool.call.arguments" in s["attrs"] for s in receiver.spans())


def test_the_file_holds_otlp_json_lines_that_read_back(tmp_path, receiver):
    run = _run(tmp_path)
    out = tmp_path / "spans.jsonl"
    assert CliRunner().invoke(app, ["export", "otel", str(run), "--file", str(out)]).exit_code == 0
    assert CliRunner().invoke(app, ["export", "otel", str(run), "--endpoint", receiver.url]).exit_code == 0
    lines = out.read_text().splitlines()
    first = json.loads(lines[0])
    span = first["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16  # OTLP/JSON: hex ids, camelCase
    assert first["resourceSpans"][0]["schemaUrl"] == SCHEMA_URL
    from_file = [s for r in read_otlp_json_lines(out) for s in flatten(r)]
    sent = receiver.spans()
    def same(spans: list[dict[str, Any]]) -> list[Any]:  # a span apart from its ids
        return sorted((s["name"], s["start"], s["end"], sorted(s["attrs"].items(), key=str)) for s in spans)

    assert len(from_file) == len(sent) and same(from_file) == same(sent)
    parents = {s["id"] for s in from_file}
    assert all(s["parent"] in parents for s in from_file if s["parent"])


def test_a_receiver_that_is_not_there_is_exit_3_in_one_line(tmp_path, receiver, monkeypatch):
    monkeypatch.setattr("orchestrator.commands.otel.EXPORT_TIMEOUT_S", 1.0)  # the exporter retries until then
    run = _run(tmp_path)
    receiver.server.shutdown()
    receiver.server.server_close()
    result = CliRunner().invoke(app, ["export", "otel", str(run), "--endpoint", receiver.url])
    assert result.exit_code == 3
    assert result.output.strip().startswith(f"{receiver.url}/v1/traces: ExportFailed: the OTLP receiver did not take")
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_bad_input_is_exit_2(tmp_path):
    run = _run(tmp_path)
    for args in (
        [str(run)],  # neither
        [str(run), "--endpoint", "http://127.0.0.1:1", "--file", str(tmp_path / "x")],  # both
        [str(run), "--endpoint", "ftp://collector"],
        [str(tmp_path / "nope"), "--file", str(tmp_path / "x")],
        [str(run), "--file", str(tmp_path / "no-such-dir" / "x.jsonl")],
    ):
        result = CliRunner().invoke(app, ["export", "otel", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_every_gen_ai_attribute_is_one_the_conventions_define(tmp_path, receiver):
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes, openai_attributes

    known = {getattr(m, n) for m in (gen_ai_attributes, openai_attributes) for n in dir(m) if n.isupper()}
    run = _run(tmp_path)
    assert (
        CliRunner()
        .invoke(app, ["export", "otel", str(run), "--endpoint", receiver.url, "--content"])
        .exit_code
        == 0
    )
    used = {
        k
        for s in receiver.spans()
        for attrs in (s["attrs"], *(a for _, a in s["events"]))
        for k in attrs
        if k.startswith(("gen_ai.", "openai."))
    }
    assert used and used <= known, used - known


def test_an_unreadable_trace_is_skipped_and_said(tmp_path):
    run = _run(tmp_path)
    trace = run / "hosts" / "box-b" / "traces" / "flip-task.0.jsonl"
    trace.unlink()
    trace.mkdir()  # listed as a trace, unreadable as one
    result = CliRunner().invoke(app, ["export", "otel", str(run), "--file", str(tmp_path / "spans.jsonl")])
    assert result.exit_code == 0, result.output
    assert "skipped box-b flip-task attempt 0: " in result.output and "Traceback" not in result.output
