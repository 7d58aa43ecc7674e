"""What the controller's model proxy and the runner's openai agent say to each other.

Both ends import these names (``orchestrator.model.proxy`` and ``agent_runner.openai_agent``), so the two
cannot drift. Standard library only, Python 3.9: this travels in the runner zipapp.

- The runner learns where the model is from one environment variable, ``CROSSHOST_MODEL_URL``, an
  OpenAI-style base URL on the host's own loopback (``model_url(port)``); it never holds a key.
- It POSTs ``<base>/chat/completions`` with its attempt's id (``ATTEMPT_HEADER``) and placeholder
  (``attempt_token``) as the bearer token; the proxy forwards nothing else.
- Every proxy answer carries ``X-Crosshost-Call``: the JSON record of the request (id, status,
  attempts, usage), which the runner writes into the trace.
- A refusal or failure is ``{"error": {"type": ERR_*, "code": ..., "message": ...}}``. ``ERR_BUDGET``
  (a per-run cap is spent) has the code ``budget_model``, the finish reason the agent stops with;
  every other type is a harness failure, the attempt's verdict ``error``.
"""

import hashlib
import hmac

MODEL_URL_ENV = "CROSSHOST_MODEL_URL"
API_BASE_PATH = "/v1"
CHAT_PATH = "/chat/completions"  # below the base URL
CALL_HEADER = "X-Crosshost-Call"
#: on every request of an attempt: "<task>.<attempt>", so a held model answers it from the reference's record
ATTEMPT_HEADER = "X-Crosshost-Attempt"

ERR_BUDGET = "crosshost_budget"
ERR_REFUSED = "crosshost_refused"
ERR_UNREACHABLE = "crosshost_provider_unreachable"
ERR_PROVIDER = "crosshost_provider_error"
ERR_BAD_JSON = "crosshost_provider_bad_json"
#: hold_model = "strict": this host's request differs from the reference's record; the attempt ends
ERR_DIVERGED = "crosshost_model_diverged"

#: the runner's secret of its host's proxy (never an attempt's): each attempt's placeholder API key is
#: derived from it and the attempt's id (``attempt_token``); the proxy accepts a request of an attempt
#: only with that attempt's placeholder, and swaps it for the real key
MODEL_PASS_ENV = "CROSSHOST_MODEL_STANDIN"
#: an exec agent's base path: <proxy>/attempt/<task>.<attempt>, then the SDK's own path below it
#: (``/v1/chat/completions`` or ``/v1/messages``), so the proxy knows the attempt of every exchange
EXEC_PREFIX = "/attempt/"
MESSAGES_PATH = "/messages"  # Anthropic messages, below API_BASE_PATH
#: POST {"attempt": "<task>.<attempt>"} (with the placeholder): the trace turns the proxy built
TURNS_PATH = "/crosshost/turns"
#: POST {"attempt": "<task>.<attempt>", "root": "<the attempt's directory>"} (with the placeholder),
#: before the agent starts: a held model compares requests with this host's paths set aside
ATTEMPT_PATH = "/crosshost/attempt"

#: how the proxy's refusal of an API the suite did not declare begins (the attempt's error, and a
#: reason the run is not valid: its model was never asked)
REFUSED_API = "the agent called "

FINISH_BUDGET_MODEL = "budget_model"
FINISH_MODEL_DIVERGED = "model_diverged"


def attempt_token(secret: str, attempt: str) -> str:
    """The placeholder API key of ``attempt`` ("<task>.<attempt>"): it opens that attempt's requests,
    turns and directory on its host's proxy and nothing else; another attempt's cannot be made from
    it without ``secret``."""
    digest = hmac.new(secret.encode(), attempt.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
    return "crosshost-" + digest[:40]


def model_url(port: int) -> str:
    """``CROSSHOST_MODEL_URL`` for a proxy (or a forward to it) on 127.0.0.1:``port``."""
    return f"http://127.0.0.1:{port}{API_BASE_PATH}"


def proxy_root(url: str) -> str:
    """The proxy's origin (``http://127.0.0.1:<port>``) from a ``CROSSHOST_MODEL_URL``."""
    return url[: -len(API_BASE_PATH)] if url.endswith(API_BASE_PATH) else url.rstrip("/")
