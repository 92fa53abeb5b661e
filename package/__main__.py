from ggbatch.runner.entry import main

main()
