"""KV layouts as vLLM registers them: declared without torch (specs), position-filled
pools and their page maps (fill), and the exact tensor views over raw pools (build). Shared
by the packed_page tier and the model-free transfer provider."""
