"""Tokenizer formats besides ``tokenizer.json``, each turned into one ``tokenizers.Tokenizer``.

Every stage (the preprocessor's encoding, byte bounds and length floors; the postprocessor's incremental
detokenizer and logprob texts; the mocker's script reader) is written against the Rust
``tokenizers.Tokenizer``. So each other format is converted into one at load, once per process
(services/common/tokenizer_files.py), and checked against its own reference library in the tests:

- ``tiktoken_bpe``: a tiktoken ranks file (``tiktoken.model``, ``*.tiktoken``: Kimi K2's format) and its
  split pattern;
- ``sentencepiece_model``: a SentencePiece ``tokenizer.model`` (BPE or Unigram);
- ``remote_code``: a tokenizer class in the model directory (``tokenizer_config.json`` ``auto_map``),
  run by transformers only under ``--trust-remote-code``;
- ``fast_encoder``: fastokens (``--tokenizer fastokens``) for encoding only, over the converted tokenizer.
"""
