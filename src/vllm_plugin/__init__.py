"""vLLM general plugin for quantized DFlash drafters and drafter sliding-window attention (see qdflash_vllm)."""
