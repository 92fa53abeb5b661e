"""Before any worker starts: the layout (workers, threads, slots), the memory plan, the nodes."""
