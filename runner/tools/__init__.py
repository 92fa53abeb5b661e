"""Side tools, apart from the job path: the commands `ggbatch make-model` (the models themselves
are runner/model/make's), `ggbatch bench` (llama-batched-bench's table for
the engine and the runner's overhead) and `ggbatch tune` (layout trials whose winner the job
path's runner/plan/tuned.py reads). A job never imports these."""
