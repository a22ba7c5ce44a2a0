"""The cached mixers of `insert-cached-attention` (`passes/insert_cached_attention.py`, the
driver): one module per mixer, giving its matcher (its `find` over a function), the cached op it
builds and its cache arguments (their `ad.cache` roles, types and sizes), as a `CachedMixer`
line of `table.py`; what a mixer and the driver share (`interface.py`); the pieces several
mixers use (an attention's mask, `masks.py`; the forms of its scores, `attention_forms.py`;
DeepSeek's indexer, `sparse_attention.py`; DeepSeek-V4's compressed entries,
`compressed_attention.py`); and what the driver does once the mixers are cached (the counted
positions, `positions.py`; the logits of some tokens, `logits.py`). The matchers themselves live
in `passes/patterns/`, which imports nothing from here."""
