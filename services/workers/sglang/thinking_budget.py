"""The thinking budget on SGLang: its own ``ThinkingBudgetLogitProcessor``, named per request.

SGLang enforces a budget with a custom logit processor: a request carries the processor class serialised
(``custom_logit_processor``, its ``to_str()``) and the budget (``sampling_params.custom_params =
{"thinking_budget": N}``); in the scheduler, the processor finds the open thinking block in the prompt and
output ids and, once it holds N tokens, forces the end marker. The block counts from the prompt's last
opening marker (the template opened it) or the model's own, as services/workers/thinking_budget.py describes.

- The class is SGLang's subclass for the worker's reasoning format (``qwen3`` → ``Qwen3ThinkingBudget...``,
  ``glm45`` → ``Glm4MoeThinkingBudget...``, ``deepseek_r1`` → ``DeepSeekR1ThinkingBudget...``) when its
  hard-coded marker ids are the model's, else SGLang's base class. Either way it gets the model's own
  marker ids, looked up in its vocabulary as the vLLM and hf workers do, so every format whose markers are
  single tokens is enforced, and a model without them is refused (400) with the reason.
- The same semantics as vLLM and hf: SGLang's processor forces a newline before the end marker, which would
  make the block one token longer than the budget (and open a budget of 0 with a newline). The subclass
  names the end marker as that newline, so the end marker is forced as soon as the block holds the budget.
- The subclass is made at start-up, not defined in a module, so dill serialises it by value: SGLang's
  scheduler rebuilds it from the request without importing Meshfront.
- Custom logit processors need ``--enable-custom-logit-processor``, which the worker turns on itself
  (config.py). SGLang keeps it off by default because its HTTP API would run any client's pickled code;
  this worker never starts that server, and only it builds requests. SGLang refuses the flag together
  with ``--enable-watermark``: such a worker refuses budgets (400), as before.

- Timing: the processor reads the request's tokens from SGLang's ``Req`` (``output_ids``). SGLang's overlap
  scheduler (its default) samples a decode step before it has recorded the previous step's token unless
  sampling is delayed, and the processor, one token behind, would force the end marker a token late, and
  twice. The worker turns on SGLang's delayed sampling with the processor (config.py,
  ``SGLANG_ENABLE_DELAY_SAMPLE``), so the view is current in both modes
  (tests/engine_env/sglang/test_sglang_thinking_budget_timing.py).

Cost: while a request with a budget decodes, SGLang's processor copies its prompt and output ids into a
list at every step (SGLang's own Python, in the scheduler), so it grows with the context.
"""

from __future__ import annotations

from sglang.srt.sampling.custom_logit_processor import (
    DeepSeekR1ThinkingBudgetLogitProcessor,
    Glm4MoeThinkingBudgetLogitProcessor,
    Qwen3ThinkingBudgetLogitProcessor,
    ThinkingBudgetLogitProcessor,
)

from services.workers.model_dir import load_tokenizer
from services.workers.thinking_budget import ThinkingMarkers, thinking_markers

# The reasoning formats SGLang 0.5.23 ships a thinking-budget subclass for.
SGLANG_SUBCLASSES: dict[str, type[ThinkingBudgetLogitProcessor]] = {
    "qwen3": Qwen3ThinkingBudgetLogitProcessor,
    "glm45": Glm4MoeThinkingBudgetLogitProcessor,
    "deepseek_r1": DeepSeekR1ThinkingBudgetLogitProcessor,
}
CUSTOM_PROCESSORS_OFF = ThinkingMarkers(why_not="SGLang runs without custom logit processors, which enforce it "
                                                "(its --enable-watermark excludes them)")


def processor_class(reasoning_parser: str, markers: ThinkingMarkers) -> type[ThinkingBudgetLogitProcessor]:
    """SGLang's thinking-budget processor for ``reasoning_parser``, with the model's marker ids ``markers``."""
    base: type[ThinkingBudgetLogitProcessor] = ThinkingBudgetLogitProcessor
    subclass = SGLANG_SUBCLASSES.get(reasoning_parser)
    if subclass is not None and (markers.start, markers.end) == (subclass.THINKING_START_TOKEN_ID,
                                                                subclass.THINKING_END_TOKEN_ID):
        base = subclass  # the model has the vocabulary SGLang's subclass was written for
    return type(f"Meshfront{base.__name__}", (base,), {
        "__module__": __name__,
        "__doc__": f"SGLang's {base.__name__} with this model's markers, closing at the budget.",
        "THINKING_START_TOKEN_ID": markers.start,
        "THINKING_END_TOKEN_ID": markers.end,
        # The end marker as SGLang's newline: it is forced at the budget, with no newline before it.
        "NEW_LINE_TOKEN_ID": markers.end,
    })


def enforcement(reasoning_parser: str, model_dir: str, custom_processors: bool) -> tuple[ThinkingMarkers, str]:
    """The thinking markers (or why a budget cannot be enforced) and the serialised processor ("" then).

    ``custom_processors``: the started engine allows custom logit processors.
    """
    markers = thinking_markers(reasoning_parser, load_tokenizer(model_dir))
    if not markers.enforceable:
        return markers, ""
    if not custom_processors:
        return CUSTOM_PROCESSORS_OFF, ""
    return markers, processor_class(reasoning_parser, markers).to_str()
