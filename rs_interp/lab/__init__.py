"""The theory lab, apart from the library's analyses: :mod:`.geometry` (attention collapse and the skip,
LayerNorm, the identity path). Importing this package loads nothing heavy."""
