"""Audio through vLLM 0.32's CPU build (runs in .venv-vllm): the adapter's mapping, KV-event salting, and one real
engine serving the demo audio model (services/models/qwen_audio.py, a tiny random Qwen2-Audio) with audio prompts
placed the way the preprocessor places them."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from tokenizers import Tokenizer
from vllm import SamplingParams
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys
from vllm.v1.request import Request

from services.common import audio_samples
from services.common.hashing import block_hashes, media_block_infos, sequence_hashes
from services.launcher.run import VLLM_CPU_KV_CACHE_BYTES
from services.models.qwen_audio import AUDIO_TOKEN_IDS, default_audio_model_dir
from services.preprocessor.media import decode, placement
from services.workers.engine import MediaInput, RequestRejected, engine_token_ids
from services.workers.engine_kv import BlockHashTranslator
from services.workers.vllm import media
from services.workers.vllm.kv_events import batch_decoder
from tests.media_samples import mp3, png, wav

pytestmark = pytest.mark.timeout(1800)

BLOCK = 128  # vLLM's CPU block size
AUDIO = AUDIO_TOKEN_IDS["<|AUDIO|>"]
# More than one block of text before the clip, so that a different clip still shares the first block.
PROMPT = ("<|im_start|>user\n" + "Listen carefully to the following recording. " * 20
          + "<|audio_bos|><|AUDIO|><|audio_eos|>What is said?<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def model_dir():
    return default_audio_model_dir(with_weights=True)


def test_an_audio_clip_becomes_16_khz_samples_and_a_content_uuid():
    fields = media.multimodal_fields([MediaInput("audio", format="wav", content=wav(1.5), content_hash=0xA0D10)])
    [(samples, rate)] = fields["multi_modal_data"]["audio"]
    assert rate == 16000 and samples.dtype == np.float32 and samples.shape == (24000,)
    assert fields["multi_modal_uuids"] == {"audio": ["xxh3:00000000000a0d10"]}
    mp3_fields = media.multimodal_fields([MediaInput("audio", format="mp3", content=mp3(1.0), content_hash=1)])
    assert mp3_fields["multi_modal_data"]["audio"][0][1] == 16000
    with pytest.raises(RequestRejected, match="audio clip could not be decoded: it is not wav audio"):
        media.multimodal_fields([MediaInput("audio", format="wav", content=png(8, 8), content_hash=2)])


class Recorder:
    def __init__(self):
        self.stored_hashes: list[int] = []

    def stored(self, blocks, parent_hash):
        self.stored_hashes += [b.block_hash for b in blocks]

    def removed(self, hashes):
        pass

    def cleared(self):
        pass


def worker_hashes(tokens: list[int], items: list[MediaInput], bs: int = 4) -> list[int]:
    """The hashes the worker publishes for vLLM's own per-block extra keys of a request carrying ``items``."""
    features = [MultiModalFeatureSpec(data=None, modality=i.modality, identifier=media.mm_uuid(i.content_hash),
                                      mm_position=PlaceholderRange(offset=i.token_offset, length=i.token_count))
                for i in items]
    request = Request("r", tokens, SamplingParams(max_tokens=1), None, mm_features=features)
    keys, mm_idx = [], 0
    n = len(tokens) // bs
    for start in range(0, n * bs, bs):
        block_keys, mm_idx = generate_block_hash_extra_keys(request, start, start + bs, mm_idx)
        keys.append(block_keys)
    event = BlockStored(block_hashes=[f"e{i}".encode() for i in range(n)], parent_block_hash=None,
                        token_ids=tokens[:n * bs], block_size=bs, lora_id=None, medium="GPU", lora_name=None,
                        extra_keys=to_event_extra_keys(keys))
    recorder = Recorder()
    translator = BlockHashTranslator(recorder, bs)
    for e in batch_decoder()(msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=[event]))):
        translator.apply(e)
    return recorder.stored_hashes


def test_an_audio_blocks_hash_is_salted_as_the_preprocessor_salts_the_prompt():
    clip = MediaInput("audio", format="wav", content_hash=0xC0FFEE, token_offset=5, token_count=7)
    tokens = [1, 2, 3, 4, 5] + [AUDIO] * 7 + [6, 7, 8, 9]
    preprocessor = sequence_hashes(block_hashes(tokens, 4, block_mm_infos=media_block_infos([(5, 7, 0xC0FFEE)], 4)))
    assert worker_hashes(tokens, [clip]) == preprocessor
    other = worker_hashes(tokens, [MediaInput("audio", format="wav", content_hash=0xBAD, token_offset=5,
                                              token_count=7)])
    assert other[0] == preprocessor[0] and other[1] != preprocessor[1]  # the text block shared, no block after


@pytest.fixture(scope="module")
def llm(model_dir):
    from vllm import LLM

    engine = LLM(model=str(model_dir), kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES, max_model_len=2048,
                 enforce_eager=True, limit_mm_per_prompt={"audio": 1}, skip_mm_profiling=True, max_num_seqs=2)
    yield engine
    del engine


def placed(model_dir, clip: bytes, content_hash: int) -> tuple[list[int], MediaInput]:
    """The prompt's token ids and the audio item, as the preprocessor builds them (decode.py, placement.py)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    spec = placement.load_spec(str(model_dir), tokenizer)
    info = decode.decode_audio(clip, "wav", audio_samples.SAMPLING_RATE, 30.0)
    count = placement.item_tokens("audio", 0, 0, 0, info.duration_s, spec, samples=info.samples)
    ids, [where] = placement.expand(tokenizer.encode(PROMPT, add_special_tokens=False).ids, [("audio", count)], spec)
    return ids, MediaInput("audio", format="wav", content=clip, content_hash=content_hash,
                           token_offset=where.offset, token_count=where.count)


def worker_prompt(ids: list[int], items: list[MediaInput]):
    """The prompt the vLLM worker gives vLLM (services/workers/vllm/engine.py)."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=engine_token_ids(ids, items))
    prompt.update(media.multimodal_fields(items))  # type: ignore[typeddict-item]
    return prompt


def run(llm, prompt) -> object:
    [out] = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    return out


def test_an_audio_prompt_runs_with_the_preprocessors_count_and_caches(llm, model_dir):
    assert media.input_modalities(llm.llm_engine.model_config) == ("audio",)
    # 44.1 kHz stereo for 7.3 s: 116800 samples at 16 kHz, 730 mel frames, halved twice: 182 tokens.
    clip = wav(7.3)
    ids, item = placed(model_dir, clip, 0xA1)
    assert item.token_count == 182 and item.token_offset > BLOCK and len(ids) > 2 * BLOCK

    prompt = worker_prompt(ids, [item])
    first = run(llm, prompt)
    # vLLM expanded the collapsed placeholder to the preprocessor's count: its prompt is the mesh's.
    assert list(first.prompt_token_ids) == ids and len(first.outputs[0].token_ids) == 4

    # vLLM's own placement of the same samples, from the unexpanded text: the same prompt, token for token.
    samples = audio_samples.decode(clip, "wav", 16000, 30.0)
    own = run(llm, {"prompt": PROMPT, "multi_modal_data": {"audio": (samples, 16000)}})
    assert list(own.prompt_token_ids) == ids

    # The same clip again: every full block is in vLLM's prefix cache (the uuid names the same item) ...
    again = run(llm, prompt)
    assert again.num_cached_tokens == (len(ids) - 1) // BLOCK * BLOCK  # (the last token is always computed)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    # ... and a different clip of the same length in the same place shares only the text blocks before it.
    other_ids, other = placed(model_dir, wav(7.3, seed=1), 0xB2)
    assert other_ids == ids
    assert run(llm, worker_prompt(other_ids, [other])).num_cached_tokens == item.token_offset // BLOCK * BLOCK
