"""Records to questions: prompts rendered, tokenized, deduplicated, grouped, a window at a time."""
