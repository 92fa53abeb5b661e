"""Side tools, apart from the job path: `ggbatch make-model` (random-weight GGUF models of real
shapes, with gguf_vocab's tokenizer metadata), `ggbatch bench` (llama-batched-bench's table for
the engine and the runner's overhead) and `ggbatch tune` (layout trials whose winner the job
path's runner/plan/tuned.py reads). A job never imports these, except modelgen to build `demo`."""
