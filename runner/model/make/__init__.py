"""Random-weight GGUF models of real shapes and vocabularies (`ggbatch make-model`, the demo model, test models)."""
