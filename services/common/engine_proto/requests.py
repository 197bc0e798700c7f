"""Our ``PreprocessedRequest`` as each engine service's Generate request, and what none of them can carry.

Tokens in, tokens out, as with our own workers: the prompt goes as token ids, and stop strings never reach
the engine (the postprocessor matches them on text, so the engine is not asked to detokenize); the model's
EOS ids and the hidden stop ids become the engine's ``stop_token_ids``, so it stops at exactly the ids the
preprocessor chose. The gateway fans ``n`` out into n requests: ``n`` is always 1.

A knob our request leaves unset takes the model's default first, as vLLM's own server and our workers give
it: the generation-config defaults the engine advertised in GetModelInfo, carried on its card
(``WorkerCard.sampling_defaults``, filled by ``meshfront attach``); an engine's servicer does not apply them
itself. What is still unset means "the engine's default": vLLM's proto has presence for the knobs that need it;
SGLang's scheduler proto has none, so an unset knob is sent as OpenAI's default (temperature 1, top_p 1, no
top_k, repetition penalty 1), not as the proto's zero (greedy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from meshfront.common.v1 import common_pb2
from smg_grpc_proto import sglang_scheduler_pb2, trtllm_service_pb2, vllm_engine_pb2

from services.common.cards import SGLANG_SCHEDULER, TRTLLM_SERVICE, VLLM_ENGINE

GenerateRequest: TypeAlias = (vllm_engine_pb2.GenerateRequest | sglang_scheduler_pb2.GenerateRequest
                   | trtllm_service_pb2.GenerateRequest)
EmbedRequest: TypeAlias = (vllm_engine_pb2.EmbedRequest | sglang_scheduler_pb2.EmbedRequest
                           | trtllm_service_pb2.EmbedRequest)
AbortRequest: TypeAlias = (vllm_engine_pb2.AbortRequest | sglang_scheduler_pb2.AbortRequest
                           | trtllm_service_pb2.AbortRequest)

# The knobs a request may leave to the model's generation config (SMG's servicers advertise these; vLLM's own
# server's get_diff_sampling_param list, less max_tokens, which the mesh sizes itself).
SAMPLING_DEFAULT_KNOBS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                          "repetition_penalty")
SamplingDefaults: TypeAlias = Sequence[tuple[str, float]]

# vLLM's SamplingParams.seed is an int32 on this proto; ours (OpenAI's) is 64-bit. The low 31 bits keep a
# seed's point, the same output for the same seed, for every seed a client sends.
_INT32_SEED = 0x7FFFFFFF
_NAMES = {VLLM_ENGINE: "vLLM's engine proto", SGLANG_SCHEDULER: "SGLang's scheduler proto",
          TRTLLM_SERVICE: "TensorRT-LLM's service proto"}


class Unsupported(ValueError):
    """The request needs something the engine's proto cannot carry; ``param`` names the request's field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def refusal(protocol: str, request: common_pb2.PreprocessedRequest, *, disaggregated: bool = False
            ) -> Unsupported | None:
    """Why ``request`` cannot go to an engine serving ``protocol`` (a 400 for the client), or None.
    ``disaggregated``: the route splits it into a prefill and a decode leg."""
    name = _NAMES[protocol]
    if request.media:
        # The protos take engine-specific preprocessed pixel tensors with placeholder offsets (or URLs expanded
        # by the engine's own processor), which our preprocessor does not produce.
        return Unsupported(f"images, video and audio cannot be sent to an engine attached over {name}",
                           "messages")
    if disaggregated or request.HasField("disaggregation"):
        return Unsupported(f"disaggregated prefill and decode legs are not carried over {name}; "
                           "serve this model aggregated", "model")
    if request.stop.HasField("max_thinking_tokens"):
        return Unsupported(f"a thinking budget (max_thinking_tokens) is not carried over {name}",
                           "max_thinking_tokens")
    return _refusal_of(protocol, request, name)


def _refusal_of(protocol: str, request: common_pb2.PreprocessedRequest, name: str) -> Unsupported | None:
    """What one service's proto lacks that another's has."""
    if request.HasField("lora") and protocol != SGLANG_SCHEDULER:
        return Unsupported(f"LoRA adapters are not carried over {name} (only SGLang's names an adapter)", "model")
    if protocol == SGLANG_SCHEDULER and request.sampling.HasField("seed"):
        return Unsupported(f"seed is not carried over {name}", "seed")
    if protocol != VLLM_ENGINE and request.sampling.guided_decoding.choice:
        return Unsupported(f"a choice constraint is not carried over {name}", "guided_choice")
    if protocol == TRTLLM_SERVICE and request.HasField("dp_rank"):
        return Unsupported(f"a data-parallel rank is not carried over {name}", "model")
    return None


def generate_request(protocol: str, request: common_pb2.PreprocessedRequest, request_id: str,
                     context_length: int, defaults: SamplingDefaults = ()) -> GenerateRequest:
    """The streaming Generate request for ``request`` (already cleared by ``refusal``) under the engine's id
    ``request_id``; ``context_length`` (the card's) sizes TensorRT-LLM's max_tokens, which has no "unset";
    ``defaults`` (the card's ``sampling_defaults``) fill the knobs ``request`` leaves unset."""
    sampling = with_defaults(request.sampling, defaults)
    if protocol == VLLM_ENGINE:
        return _vllm(request, sampling, request_id)
    if protocol == SGLANG_SCHEDULER:
        return _sglang(request, sampling, request_id)
    if protocol == TRTLLM_SERVICE:
        return _trtllm(request, sampling, request_id, context_length)
    raise ValueError(f"unknown engine protocol {protocol!r}")


def with_defaults(sampling: common_pb2.SamplingOptions, defaults: SamplingDefaults) -> common_pb2.SamplingOptions:
    """``sampling`` with each knob it leaves unset set from ``defaults`` (a copy; ``sampling`` itself when none
    applies). A knob the client set, even to the proto's zero, stays the client's."""
    missing = [(knob, value) for knob, value in defaults if not sampling.HasField(knob)]
    if not missing:
        return sampling
    filled = common_pb2.SamplingOptions()
    filled.CopyFrom(sampling)
    for knob, value in missing:
        if knob not in SAMPLING_DEFAULT_KNOBS:
            raise ValueError(f"{knob!r} is not a sampling knob a request may leave to the model")
        setattr(filled, knob, int(value) if knob == "top_k" else value)
    return filled


def embed_request(protocol: str, request_id: str, token_ids: list[int]) -> EmbedRequest:
    """One input's Embed request (the protos embed one sequence a call)."""
    if protocol == VLLM_ENGINE:
        return vllm_engine_pb2.EmbedRequest(request_id=request_id,
                                            tokenized=vllm_engine_pb2.TokenizedInput(input_ids=token_ids))
    if protocol == SGLANG_SCHEDULER:
        return sglang_scheduler_pb2.EmbedRequest(request_id=request_id,
                                                 tokenized=sglang_scheduler_pb2.TokenizedInput(input_ids=token_ids))
    if protocol == TRTLLM_SERVICE:
        return trtllm_service_pb2.EmbedRequest(
            request_id=request_id, tokenized=trtllm_service_pb2.TokenizedInput(input_token_ids=token_ids))
    raise ValueError(f"unknown engine protocol {protocol!r}")


def abort_request(protocol: str, request_id: str) -> AbortRequest:
    """The Abort for the engine's sequence ``request_id``."""
    if protocol == VLLM_ENGINE:
        return vllm_engine_pb2.AbortRequest(request_ids=[request_id])
    if protocol == SGLANG_SCHEDULER:
        return sglang_scheduler_pb2.AbortRequest(request_id=request_id, reason="cancelled by the client")
    if protocol == TRTLLM_SERVICE:
        return trtllm_service_pb2.AbortRequest(request_id=request_id)
    raise ValueError(f"unknown engine protocol {protocol!r}")


def _stop_ids(request: common_pb2.PreprocessedRequest) -> list[int]:
    return list(dict.fromkeys((*request.eos_token_ids, *request.stop.stop_token_ids_hidden)))


def _vllm(request: common_pb2.PreprocessedRequest, s: common_pb2.SamplingOptions,
          request_id: str) -> vllm_engine_pb2.GenerateRequest:
    stop = request.stop
    p = vllm_engine_pb2.SamplingParams(n=1, stop_token_ids=_stop_ids(request), ignore_eos=stop.ignore_eos,
                                       min_tokens=stop.min_tokens, skip_special_tokens=False)
    for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
        if s.HasField(name):  # names shared by both messages; the unit tests set each one
            setattr(p, name, getattr(s, name))
    if s.HasField("top_k") and s.top_k > 0:  # ours: -1 disables; theirs: 0 does
        p.top_k = s.top_k
    if s.HasField("seed"):
        p.seed = s.seed & _INT32_SEED
    if stop.HasField("max_tokens"):
        p.max_tokens = stop.max_tokens
    if request.output.HasField("logprobs"):
        p.logprobs = request.output.logprobs
    _vllm_constraint(s.guided_decoding, p)
    out = vllm_engine_pb2.GenerateRequest(request_id=request_id, sampling_params=p, stream=True,
                                          tokenized=vllm_engine_pb2.TokenizedInput(input_ids=request.token_ids))
    if request.HasField("dp_rank"):
        out.data_parallel_rank = request.dp_rank
    return out


def _vllm_constraint(g: common_pb2.GuidedDecoding, p: vllm_engine_pb2.SamplingParams) -> None:
    """vLLM's constraint oneof: every kind of ours has its own field."""
    if g.json_schema:
        p.json_schema = g.json_schema
    elif g.json_object:
        p.json_object = True
    elif g.regex:
        p.regex = g.regex
    elif g.choice:
        p.choice.choices.extend(g.choice)
    elif g.grammar:
        p.grammar = g.grammar
    elif g.structural_tag:
        p.structural_tag = g.structural_tag


def _sglang(request: common_pb2.PreprocessedRequest, s: common_pb2.SamplingOptions,
            request_id: str) -> sglang_scheduler_pb2.GenerateRequest:
    stop = request.stop
    p = sglang_scheduler_pb2.SamplingParams(
        n=1, stop_token_ids=_stop_ids(request), ignore_eos=stop.ignore_eos, min_new_tokens=stop.min_tokens,
        skip_special_tokens=False,
        temperature=s.temperature if s.HasField("temperature") else 1.0,
        top_p=s.top_p if s.HasField("top_p") else 1.0,
        top_k=s.top_k if s.HasField("top_k") and s.top_k > 0 else -1,
        min_p=s.min_p, frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty if s.HasField("repetition_penalty") else 1.0)
    if stop.HasField("max_tokens"):
        p.max_new_tokens = stop.max_tokens
    g = s.guided_decoding
    if g.json_schema:
        p.json_schema = g.json_schema
    elif g.json_object:  # SGLang's own server turns json_object into this schema
        p.json_schema = '{"type": "object"}'
    elif g.regex:
        p.regex = g.regex
    elif g.grammar:
        p.ebnf_grammar = g.grammar
    elif g.structural_tag:
        p.structural_tag = g.structural_tag
    out = sglang_scheduler_pb2.GenerateRequest(
        request_id=request_id, sampling_params=p, stream=True,
        tokenized=sglang_scheduler_pb2.TokenizedInput(input_ids=request.token_ids))
    if request.output.HasField("logprobs"):
        out.return_logprob = True
        out.top_logprobs_num = request.output.logprobs
        out.logprob_start_len = -1  # output tokens only, no prompt logprobs
    if request.HasField("lora"):
        out.lora_id = request.lora.name  # the id the adapter was loaded under (LoadLoRAAdapter's lora_id)
    if request.HasField("dp_rank"):
        out.data_parallel_rank = request.dp_rank
    return out


_GUIDE = trtllm_service_pb2.GuidedDecodingParams


def _trtllm(request: common_pb2.PreprocessedRequest, s: common_pb2.SamplingOptions, request_id: str,
            context_length: int) -> trtllm_service_pb2.GenerateRequest:
    stop = request.stop
    c = trtllm_service_pb2.SamplingConfig(beam_width=1, num_return_sequences=1)
    for name in ("temperature", "top_p", "seed", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty"):
        if s.HasField(name):  # names shared by both messages; the unit tests set each one
            setattr(c, name, getattr(s, name))
    if s.HasField("top_k") and s.top_k > 0:
        c.top_k = s.top_k
    if stop.HasField("min_tokens"):
        c.min_tokens = stop.min_tokens
    room = max(context_length - len(request.token_ids), 1)
    out = trtllm_service_pb2.GenerateRequest(
        request_id=request_id, streaming=True, sampling_config=c, stop_token_ids=_stop_ids(request),
        ignore_eos=stop.ignore_eos, tokenized=trtllm_service_pb2.TokenizedInput(input_token_ids=request.token_ids),
        max_tokens=min(stop.max_tokens, room) if stop.HasField("max_tokens") else room)
    if request.output.HasField("logprobs"):
        out.output_config.logprobs = request.output.logprobs
    g = s.guided_decoding
    guide = ((_GUIDE.GUIDE_TYPE_JSON_SCHEMA, g.json_schema) if g.json_schema
             else (_GUIDE.GUIDE_TYPE_JSON, "") if g.json_object
             else (_GUIDE.GUIDE_TYPE_REGEX, g.regex) if g.regex
             else (_GUIDE.GUIDE_TYPE_EBNF_GRAMMAR, g.grammar) if g.grammar
             else (_GUIDE.GUIDE_TYPE_STRUCTURAL_TAG, g.structural_tag) if g.structural_tag else None)
    if guide is not None:
        out.guided_decoding.guide_type, out.guided_decoding.guide = guide
    return out

