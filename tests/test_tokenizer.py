from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from heterorl.tokenizer import CHARACTERS, build_char_tokenizer


def test_round_trip_of_every_character() -> None:
    tok = build_char_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    ids = tok(CHARACTERS, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(CHARACTERS)  # one token per character
    assert tok.decode(ids) == CHARACTERS


def test_special_tokens_and_left_padding() -> None:
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    enc = tok(["7", "12+3="], padding=True, add_special_tokens=False)
    assert enc["input_ids"][0][:4] == [0, 0, 0, 0]
    assert enc["attention_mask"] == [[0, 0, 0, 0, 1], [1, 1, 1, 1, 1]]
    assert tok.decode([*enc["input_ids"][1], tok.eos_token_id], skip_special_tokens=True) == "12+3="


def test_unknown_characters_map_to_unk() -> None:
    tok = build_char_tokenizer()
    assert tok("A", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_saved_and_reloaded_with_auto_tokenizer(tmp_path: Path) -> None:
    build_char_tokenizer().save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("ab=", add_special_tokens=False)["input_ids"] == build_char_tokenizer()("ab=")["input_ids"]
    assert len(again) == len(CHARACTERS) + 3
