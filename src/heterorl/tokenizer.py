"""A character-level tokenizer for the built-in tasks that is a real transformers tokenizer.

Every character is one token (WordLevel over single characters), so the built-in tasks need no vocabulary
learning and a 46-token embedding. It is a `PreTrainedTokenizerFast`, saved with every checkpoint and reloaded
with `AutoTokenizer.from_pretrained`, exactly like the tokenizer of a hub model.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARACTERS = "0123456789+-=*>| abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    """Tokenizer with ids 0/1/2 = pad/eos/unk followed by one id per character; pads on the left (generation)."""
    if len(set(characters)) != len(characters):
        raise ValueError("characters must be distinct")
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *characters])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
