"""runtime: the serving runtime (llm_api, factory, reference_llm, loader, detok, capture); measurement is in eagle3_trt/measure."""
