"""What signing costs the learner and checking costs a sampler, per weight update, beside publishing it (CPU
seconds: time.process_time, one thread; the load average is printed with each row).

    python benchmarks/sign_cost.py

Signing is a BLAKE2b-256 pass over each blob plus one Ed25519 signature (`weights/signing.py`); the learner's
`Signer` caches the signature of a blob served again, so a snapshot or merged patch sent to many samplers is signed
once. Checking is the same pass plus one Ed25519 verification.
"""

from __future__ import annotations

import os
import time

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.config import ModelConfig
from heterorl.policy import Policy
from heterorl.weights import WeightStore, make_codec
from heterorl.weights.envelope import sign_update
from heterorl.weights.signing import Authority, Signer

MODELS = {
    "demo (0.3M)": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256},
    "qwen3 512x4 (10.7M)": {
        "hidden_size": 512,
        "num_layers": 4,
        "num_heads": 8,
        "num_kv_heads": 4,
        "intermediate_size": 1024,
    },
}


def main() -> None:
    torch.set_num_threads(1)
    print("| model | update | MB | sign ms | check ms | publish ms (PULSE patch) | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, dims in MODELS.items():
        policy = Policy.from_config(ModelConfig(arch="qwen3", **dims), seed=0)
        w0 = {n: p.detach().to(torch.bfloat16).clone() for n, p in policy.model.named_parameters()}
        w1 = {n: (t.float() + 1e-3 * torch.randn_like(t.float())).to(torch.bfloat16) for n, t in w0.items()}
        store = WeightStore(make_codec("pulse"), snapshot_every=100, wire_dtype=torch.bfloat16)
        store.publish(0, w0)
        h0 = store.latest_hash
        began = time.process_time()
        store.publish(1, w1)
        publish = time.process_time() - began
        key = Ed25519PrivateKey.generate()
        authority = Authority(key.public_key())
        for held in ((None, None), (0, h0)):
            update = store.update_for(*held)
            n = 20
            began = time.process_time()
            for _ in range(n):
                signed = sign_update(update, Signer(key, 0))  # a fresh signer each time: no cache
            sign = (time.process_time() - began) / n
            began = time.process_time()
            for _ in range(n):
                authority.verify_blobs(signed.blobs, signed.signatures)
            check = (time.process_time() - began) / n
            print(
                f"| {name} | {update.kind} | {update.nbytes / 1e6:.3f} | {sign * 1e3:.2f} | {check * 1e3:.2f} | "
                f"{publish * 1e3:.0f} | {os.getloadavg()[0]:.2f} |"
            )


if __name__ == "__main__":
    main()
