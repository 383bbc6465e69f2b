from topk_bench.cli import main

main()
