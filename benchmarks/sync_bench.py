"""Weight-sync benchmark (PULSE patches vs full weights); see heterorl.bench.pulse and docs/weight-sync.md.

python benchmarks/sync_bench.py --params 1e9 --lr 1e-6
python benchmarks/sync_bench.py --params 1e9 --change-rate 0.01
python benchmarks/sync_bench.py --base a.safetensors --new b.safetensors
"""

from heterorl.bench.pulse import main

if __name__ == "__main__":
    main()
