"""A SentencePiece ``tokenizer.model`` (BPE or Unigram) as a ``tokenizers.Tokenizer``.

The model file is a protobuf (``ModelProto``) read with the schema transformers ships, so neither the
``sentencepiece`` package nor any code runs at load. What SentencePiece does, piece by piece:

- normalisation: the precompiled character map (``nmt_nfkc`` and friends), then with
  ``remove_extra_whitespaces`` spaces stripped at both ends and runs of them collapsed, then spaces written
  as ``▁`` and, with ``add_dummy_prefix``, one ``▁`` put in front;
- words start at each ``▁`` (``split_by_whitespace``), user-defined pieces match first, whole;
- BPE: repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece; here every
  split of every piece, ordered by the piece's score (the tiktoken conversion's trick: tiktoken_bpe.py);
  Unigram: the Viterbi segmentation by score, which ``models.Unigram`` does itself;
- a character no piece covers becomes its UTF-8 bytes (``<0xE6>`` ...) under ``byte_fallback``, else
  ``<unk>``;
- decoding writes ``▁`` back as a space and drops the dummy prefix's.

Control pieces (``<s>``, ``</s>``) become special added tokens and user-defined ones plain added tokens, as
transformers converts them; an unknown piece decodes as SentencePiece's ``unk_surface`` (`` ⁇ ``).
tests/unit/common/test_tokenizer_kinds.py holds the ids to ``sentencepiece`` itself on models trained in code.
One difference stays, as in transformers' own conversions: a text that *starts* with a user-defined piece
gets no lone ``▁`` piece before it (SentencePiece's dummy prefix of an empty first word).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPACE = "▁"
# ModelProto.SentencePiece.Type and TrainerSpec.ModelType values.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNIGRAM, _BPE = 1, 2


class UnsupportedModel(ValueError):
    """A SentencePiece model this conversion does not reproduce (WORD or CHAR models, suffix whitespace)."""


def read_proto(path: str | Path):
    """The parsed ``ModelProto`` (transformers' copy of SentencePiece's schema: protobuf only)."""
    from transformers.utils import sentencepiece_model_pb2_new as pb2

    proto = pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def _normalizer(spec) -> normalizers.Normalizer:
    steps: list[normalizers.Normalizer] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        # Collapse runs, drop the trailing space, and write a leading one as the ▁ the dummy prefix would add:
        # removing it would move the text's start off offset 0, where Metaspace's "first" scheme prefixes.
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(" $"), ""),
                  normalizers.Replace(Regex("^ "), SPACE if spec.add_dummy_prefix else "")]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE))
    return normalizers.Sequence(steps)


def _bpe(proto) -> models.Model:
    pieces = proto.pieces
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    # SentencePiece merges only into normal pieces; every split of one, the best-scoring piece first.
    found: list[tuple[float, int, str, str]] = []
    for i, p in enumerate(pieces):
        if p.type != _NORMAL or len(p.piece) < 2:
            continue
        for cut in range(1, len(p.piece)):
            left, right = p.piece[:cut], p.piece[cut:]
            if left in vocab and right in vocab:
                found.append((-p.score, i, left, right))
    found.sort()
    unk = pieces[proto.trainer_spec.unk_id].piece
    return models.BPE(vocab=vocab, merges=[(left, right) for _, _, left, right in found], unk_token=unk,
                      byte_fallback=proto.trainer_spec.byte_fallback, fuse_unk=True)


def _unigram(proto) -> models.Model:
    vocab = [(p.piece, p.score) for p in proto.pieces]
    return models.Unigram(vocab, proto.trainer_spec.unk_id, proto.trainer_spec.byte_fallback)


def to_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer that encodes as SentencePiece's ``encode(text)`` (no BOS/EOS) and decodes as its
    ``decode(ids)``.

    Raises:
        UnsupportedModel: a model kind or option the conversion does not reproduce."""
    proto = read_proto(path)
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type not in (_UNIGRAM, _BPE):
        raise UnsupportedModel(f"{path}: SentencePiece model type {trainer.model_type} (only BPE and Unigram)")
    if trainer.treat_whitespace_as_suffix:
        raise UnsupportedModel(f"{path}: treat_whitespace_as_suffix is not supported")
    tokenizer = Tokenizer(_bpe(proto) if trainer.model_type == _BPE else _unigram(proto))
    tokenizer.normalizer = _normalizer(spec)
    # Words start at each ▁ (SentencePiece's split_by_whitespace); the normaliser already wrote them. The
    # dummy prefix goes here, not in the normaliser, which would also put one in front of each user-defined
    # piece's own text: "first" prefixes the text's start only, not the text after an added token.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if spec.add_dummy_prefix else "never",
        split=bool(trainer.split_by_whitespace))
    steps: list[decoders.Decoder] = []
    unk = proto.pieces[trainer.unk_id].piece
    if trainer.unk_surface != unk:  # an unknown piece decodes as " ⁇ ", not as "<unk>"
        steps.append(decoders.Replace(unk, trainer.unk_surface))
    steps += [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if spec.add_dummy_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(steps)
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                                  for p in proto.pieces if p.type == _CONTROL])
    # User-defined pieces match in the normalised text, as SentencePiece matches them: the spaces around one
    # stay ▁ pieces (matched in the raw text, the normaliser's strip would eat them).
    tokenizer.add_tokens([AddedToken(p.piece, special=False, normalized=True)
                          for p in proto.pieces if p.type == _USER_DEFINED])
    return tokenizer
