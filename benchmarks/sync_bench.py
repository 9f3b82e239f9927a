"""Weight-sync benchmark (PULSE patches vs full weights); see heterorl.weights.bench and docs/weight-sync.md.

python benchmarks/sync_bench.py --params 1e9 --lr 1e-6
python benchmarks/sync_bench.py --params 1e9 --change-rate 0.01
python benchmarks/sync_bench.py --base a.safetensors --new b.safetensors
"""

from heterorl.weights.bench import main

if __name__ == "__main__":
    main()
