"""The shared tokenizer: the simple one is stable; a real tokenizer.json loads and encodes."""

import pytest

from epp.tokenizer import HFTokenizer, SimpleTokenizer, load_tokenizer


def test_simple_tokenizer_is_deterministic_and_counts_pieces():
    t = SimpleTokenizer()
    ids = t.encode("Hello, world!")
    assert len(ids) == t.count("Hello, world!") == 4
    assert ids == SimpleTokenizer().encode("Hello, world!")
    assert ids[0] != ids[2]
    assert t.encode("Hello, world! again")[:4] == ids  # a shared prefix gives shared ids


def test_hf_tokenizer_from_a_locally_trained_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = load_tokenizer(str(tmp_path))
    assert isinstance(hf, HFTokenizer)
    ids = hf.encode("the quick brown fox")
    assert ids and ids == tok.encode("the quick brown fox", add_special_tokens=False).ids


def test_missing_tokenizer_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
