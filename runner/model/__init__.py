"""The model file: its identity (the journal's fingerprint), its GGUF header, the Hub, library versions."""
