"""The wire APIs the model proxy speaks, one module each behind one small interface (``WireApi``).

A module knows its API's paths, where its key travels, its error body, how a request carries tool
results, how an answer (whole or streamed) carries tool calls and tokens, and what of a request a held
model compares. The proxy (``orchestrator/model/proxy.py``, ``exec_forward.py``) does the rest the same
way for every API: the placeholder, the caps, the pinned model, retries, relaying, the held model and
the records.

A suite's ``api`` names a family (``openai``, ``anthropic``, ``gemini``); a request is served by the
module whose path it names, and only when that module is of the suite's family.
"""

from __future__ import annotations

from orchestrator.model.apis.anthropic_messages import AnthropicMessages
from orchestrator.model.apis.base import WireApi
from orchestrator.model.apis.gemini import Gemini
from orchestrator.model.apis.openai_chat import OpenAIChat
from orchestrator.model.apis.openai_responses import OpenAIResponses

APIS: tuple[WireApi, ...] = (OpenAIChat(), OpenAIResponses(), AnthropicMessages(), Gemini())
FAMILIES = tuple(dict.fromkeys(api.family for api in APIS))


def api_for(path: str) -> WireApi | None:
    """The module serving ``path`` (below an attempt's prefix, no query), of any family; None for a
    path no API has."""
    return next((api for api in APIS if api.serves(path)), None)


def family_api(family: str) -> WireApi:
    """The first module of a family: the one whose format a refusal is written in."""
    return next(api for api in APIS if api.family == family)
