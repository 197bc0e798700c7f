"""The postprocessor's part of ``--dyn-debug-perf`` (services/common/debug_perf.py): a request's response builder,
timed.

Made in place of the plain one only when the flag is on (service.py ``_builder``), so the token path has no check
either way: each ``build`` (a batch of worker messages through the decoder, stop strings and the output parsers)
adds its wall and CPU to the ``detokenize_parse`` section of the request's record, logged when its stream ends.
"""

from __future__ import annotations

from collections.abc import Callable

from meshfront.postprocessor.v1 import postprocessor_pb2
from meshfront.worker.v1 import worker_pb2

from services.common.debug_perf import StagePerf
from services.postprocessor.core.logprobs import TokenTexts
from services.postprocessor.core.parsers.backends import StreamingOutputParser
from services.postprocessor.core.sequence import SequenceDecoder
from services.postprocessor.response_builder import ResponseBuilder

DETOKENIZE_PARSE = "detokenize_parse"


class TimedResponseBuilder(ResponseBuilder):
    def __init__(self, decoder: SequenceDecoder, texts: TokenTexts | None, parser: StreamingOutputParser | None,
                 perf: StagePerf):
        super().__init__(decoder, texts, parser)
        self.perf = perf

    def build(self, messages: list[worker_pb2.GenerateResponse]) -> postprocessor_pb2.GenerateResponse | None:
        with self.perf.section(DETOKENIZE_PARSE):
            return super().build(messages)


def timed_builder(request_id: str) -> Callable[[SequenceDecoder, TokenTexts | None, StreamingOutputParser | None],
                                                TimedResponseBuilder]:
    """Makes the request's builder as ``ResponseBuilder(decoder, texts, parser)`` would, with its record."""
    return lambda decoder, texts, parser: TimedResponseBuilder(decoder, texts, parser,
                                                               StagePerf("postprocess", request_id))
