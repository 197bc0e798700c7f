"""OpenAI requests (parsed dataclasses) to the mesh's protos. The only place both meet."""

from __future__ import annotations

import orjson
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.gateway.core.media import Media
from services.gateway.core.request import ChatRequest, CompletionRequest, GenerationRequest
from services.gateway.core.tools import guided_decoding, tool_choice_proto


def _base(req: GenerationRequest, request_id: str) -> common_pb2.PreprocessedRequest:
    s = req.sampling
    sampling = common_pb2.SamplingOptions()
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty", "presence_penalty",
                 "repetition_penalty"):
        value = getattr(s, name)
        if value is not None:
            setattr(sampling, name, value)
    stop = common_pb2.StopConditions(stop=s.stop, ignore_eos=s.ignore_eos,
                                      include_stop_str_in_output=s.include_stop_str_in_output)
    if s.max_tokens is not None:
        stop.max_tokens = s.max_tokens
    if s.min_tokens:
        stop.min_tokens = s.min_tokens
    if s.max_thinking_tokens is not None:
        stop.max_thinking_tokens = s.max_thinking_tokens
    stop.stop_token_ids_hidden.extend(s.stop_token_ids)
    output = common_pb2.OutputOptions(skip_special_tokens=s.skip_special_tokens)
    if s.logprobs is not None:
        output.logprobs = s.logprobs
    return common_pb2.PreprocessedRequest(request_id=request_id, model=req.model, sampling=sampling, stop=stop,
                                          output=output, annotations=req.nvext.annotations)


def _media(item: Media) -> common_pb2.MediaItem:
    return common_pb2.MediaItem(modality=item.modality, url=item.url, data=item.data, format=item.format,
                                detail=item.detail, message_index=item.message_index, part_index=item.part_index,
                                uuid=item.uuid)


def chat_to_preprocess(req: ChatRequest, request_id: str) -> preprocessor_pb2.PreprocessRequest:
    out = preprocessor_pb2.PreprocessRequest(request=_base(req, request_id),
                                             return_formatted_prompt=req.nvext.wants("formatted_prompt"))
    if req.nvext.token_data is not None:
        out.tokens.ids.extend(req.nvext.token_data)  # pinned and pre-tokenized: no template
    else:
        out.messages_json = orjson.dumps(req.messages).decode()
    out.request.media.extend(_media(m) for m in req.media)
    if req.tools:
        out.tools_json = orjson.dumps(req.tools).decode()
        out.single_call = not req.parallel_tool_calls  # a structural tag stops after one call then
    if req.tool_choice is not None:
        out.tool_choice.CopyFrom(tool_choice_proto(req.tool_choice))
    if req.chat_template_kwargs:
        out.chat_template_kwargs_json = orjson.dumps(req.chat_template_kwargs).decode()
    guided = guided_decoding(req.tools, req.tool_choice, req.parallel_tool_calls, req.response_format) \
        or req.structured
    if guided is not None:
        out.request.sampling.guided_decoding.CopyFrom(common_pb2.GuidedDecoding(**guided))
    return out


def completion_to_preprocess(req: CompletionRequest, prompt: str | list[int],
                             request_id: str) -> preprocessor_pb2.PreprocessRequest:
    out = preprocessor_pb2.PreprocessRequest(request=_base(req, request_id))
    if req.structured is not None:
        out.request.sampling.guided_decoding.CopyFrom(common_pb2.GuidedDecoding(**req.structured))
    if isinstance(prompt, str):
        out.text = prompt
    else:
        out.tokens.ids.extend(prompt)
    return out


def postprocess_options(req: GenerationRequest, prep: preprocessor_pb2.PreprocessRequest
                        ) -> common_pb2.PostprocessOptions:
    """The request's own postprocess options, the same for each of its prompts (the preprocessor adds
    the model's). Tools and tool choice as ``prep`` carries them to the template: serialized once."""
    out = common_pb2.PostprocessOptions(tools_json=prep.tools_json, stream_interval=req.nvext.stream_interval)
    if prep.HasField("tool_choice"):
        out.tool_choice.CopyFrom(prep.tool_choice)
    if prep.tools_json and isinstance(req, ChatRequest):
        out.single_tool_call = not req.parallel_tool_calls
    return out
