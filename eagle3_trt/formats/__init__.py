"""Typed readers and schemas of the files a model pair ships (config.json, generation_config.json,
tokenizer files, safetensors headers, EAGLE-3 draft configs, the family table): no torch, so config
checks (validate, plan, the dry run) run without its import time, and ``core`` takes its inputs from
here without doing file I/O itself."""
