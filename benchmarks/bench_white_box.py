"""White-box step audit and crafted-final audit on MNIST dp-dense / dp-cnn (docs/white_box.md).

Parts:
  limits  the physical limit of each bound (every statistic at its expectation) for the MNIST
          schedules (q = 0.005, T = 200 per epoch) at claims 2 and 8, and the Gaussian-DP mu ratio
          of the final-sum test to the trajectory's (seconds).
  fp      false-positive rate of both statistics on simulated correct mechanisms (1,000 replicates each).
  mnist   one training run per row (no controls): each model at claims 2 and 8, the same run with the
          noise multiplied by 0.9 while the claim stays (planted in the one noise filler, as the test
          fixtures plant faults), and crafted-final on dp-dense.
  opacus  the example Opacus script's model and loop (examples/opacus_one_run_mnist.py) with the white-box
          observer (dpaudit.integrations.white_box) at claims 2 and 8, and the noise lowered to 0.9 after the claim.

Usage:
  DPAUDIT_DATA_DIR=../shared/data .venv/bin/python benchmarks/bench_white_box.py limits fp mnist [--epochs 1] [--canaries 5000] [--final-canaries 5000]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import white_box as wb

torch.set_num_threads(1)
DELTA = 1e-5


def limits(epochs: int, canaries: int) -> None:
    from dpaudit.accounting.calibration import calibrate_noise_multiplier

    for claim in (2.0, 8.0):
        for steps in sorted({200 * epochs, 2000}):
            sigma = calibrate_noise_multiplier(target_epsilon=claim, delta=DELTA, sample_rate=0.005, steps=steps, accountant="rdp").noise_multiplier
            ev = SubsampledGaussian(sigma, 0.005, steps)
            step = wb.expected_step_bound(ev, canaries, delta=DELTA)
            final = wb.expected_final_bound(ev, canaries, delta=DELTA)
            r = wb.gdp_mu_ratio(ev)
            print(f"limit claim {claim} T {steps} sigma {sigma:.4f} M {canaries}: white-box {step:.3f} ({step / claim:.3f}), "
                  f"crafted-final {final:.3f} ({final / claim:.3f}); GDP mu trajectory {r['mu_trajectory']:.3f}, "
                  f"final sum {r['mu_final']:.3f}, ratio {r['ratio']:.3f}", flush=True)


def false_positives(replicates: int = 1000) -> None:
    rng = np.random.default_rng(0)
    step_flags = final_flags = 0
    for _ in range(replicates):
        s_hi, d_lo, q_lo = wb.step_statistics(wb.simulate_steps(rng, noise=0.8, rate=0.1, steps=50, canaries=20), 0.95)
        step_flags += (d_lo <= 0 or s_hi / d_lo < 0.8) or q_lo > 0.1
        s_hi, d_lo = wb.final_statistics(wb.simulate_final(rng, noise=0.8, rate=0.05, steps=50, canaries=200), 0.05, 0.95)
        final_flags += d_lo > 0 and s_hi / d_lo < 0.8
    print(f"false positives over {replicates} replicates (upper bound: the monotonicity event): white-box {step_flags / replicates:.3f}, "
          f"crafted-final {final_flags / replicates:.3f}", flush=True)


def _pld_note(b) -> str:
    """eps_LB and the claim by the tight pld accountant (eps_LB then bounds the true epsilon)."""
    lb = wb.family_epsilon(b.noise_upper, b.sensitivity_lower, b.sample_rate_lower, b.steps, delta=DELTA, accountant="pld")
    claimed = wb.family_epsilon(b.claimed.noise_multiplier, 1.0, b.claimed.sample_rate, b.steps, delta=DELTA, accountant="pld")
    return f"pld: eps_LB {lb:.3f} of true eps {claimed:.3f} ({lb / claimed:.3f})"


def _run(model, data, claim, epochs, canaries, threat_model="white-box", noise_factor=1.0):
    from dpaudit.mechanisms import dpsgd_core
    from dpaudit.mechanisms.one_run_modules import module_config
    from dpaudit.mechanisms.white_box_target import white_box_run
    from dpaudit.noise import NoiseSource

    cfg, event = module_config(model, data, epsilon=claim, delta=DELTA, epochs=epochs)
    real = dpsgd_core.gaussian_filler
    if noise_factor != 1.0:  # the planted understatement: the claim keeps the calibrated sigma
        dpsgd_core.gaussian_filler = lambda noise, out, std: real(noise, out, noise_factor * std)
    try:
        t0 = time.perf_counter()
        run = white_box_run(model, data, cfg, canaries=canaries, noise=NoiseSource(), seed=1, threat_model=threat_model)
        train_s = time.perf_counter() - t0
    finally:
        dpsgd_core.gaussian_filler = real
    bound = (wb.step_bound if threat_model == "white-box" else wb.final_bound)(run.observations, claimed=event, delta=DELTA)
    limit = (wb.expected_step_bound if threat_model == "white-box" else wb.expected_final_bound)(event, canaries, delta=DELTA)
    b = bound.to_dict()
    print(f"{model} {threat_model} claim {claim} noise x{noise_factor} T {cfg.steps} M {canaries}: eps_LB {bound.epsilon_lb:.3f} "
          f"(claimed {bound.claimed_epsilon:.3f}, ratio {bound.ratio:.3f}, limit {limit:.3f}), violation {bound.violation}; "
          f"sigma_hi {b['noise_multiplier_upper']:.4f} (sigma {cfg.noise_multiplier:.4f}), d_lo {b['sensitivity_lower']:.4f}, "
          f"q_lo {b['sample_rate_lower']:.5f}; {_pld_note(bound)}; quiet coordinates {run.info['quiet_coordinates']}; {train_s:.0f} s",
          flush=True)


def mnist(epochs: int, canaries: int, models, final_canaries: int) -> None:
    from dpaudit.data import load_dataset

    data = load_dataset("mnist")
    for model in models:
        for claim in (2.0, 8.0):
            _run(model, data, claim, epochs, canaries)
        _run(model, data, 8.0, epochs, canaries, noise_factor=0.9)
    if "dp-dense" in models:
        for claim in (2.0, 8.0):
            _run("dp-dense", data, claim, epochs, final_canaries, threat_model="crafted-final")


def _opacus_run(data, claim: float, epochs: int, canaries: int, noise_factor: float = 1.0) -> None:
    """The example script's model and loop (examples/opacus_one_run_mnist.py: SmallCNN, Adam, batch 256, Poisson
    sampling, make_private_with_epsilon), with :class:`OpacusWhiteBox` attached; ``noise_factor`` lowers the
    optimizer's noise multiplier after attach (the claim keeps the calibrated one)."""
    import importlib.util
    from pathlib import Path

    from opacus import PrivacyEngine

    from dpaudit.integrations.white_box import OpacusWhiteBox

    spec = importlib.util.spec_from_file_location("example", Path(__file__).parent.parent / "examples" / "opacus_one_run_mnist.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.SmallCNN()
    wbox = OpacusWhiteBox(model, canaries=canaries, seed=0, tensors=["fc1.weight"])
    train = torch.utils.data.TensorDataset(torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private_with_epsilon(module=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                                                          data_loader=torch.utils.data.DataLoader(train, batch_size=256), max_grad_norm=1.0,
                                                          epochs=epochs, target_epsilon=claim, target_delta=DELTA)
    wbox.attach(opt, data_loader=loader)
    sigma = opt.noise_multiplier
    opt.noise_multiplier = sigma * noise_factor
    t0 = time.perf_counter()
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    train_s = time.perf_counter() - t0
    b = wbox.audit(delta=DELTA)
    limit = wb.expected_step_bound(wbox.claim(), canaries, delta=DELTA)
    print(f"opacus example white-box claim {claim} noise x{noise_factor} T {wbox.claim().steps} M {canaries}: eps_LB {b.epsilon_lb:.3f} "
          f"(claimed {b.claimed_epsilon:.3f}, ratio {b.ratio:.3f}, limit {limit:.3f}), violation {b.violation}; sigma_hi {b.noise_upper:.4f} "
          f"(sigma {sigma:.4f}), d_lo {b.sensitivity_lower:.4f}, q_lo {b.sample_rate_lower:.5f}; {_pld_note(b)}; {train_s:.0f} s", flush=True)


def opacus(epochs: int, canaries: int) -> None:
    from dpaudit.data import load_dataset

    data = load_dataset("mnist")
    for claim in (2.0, 8.0):
        _opacus_run(data, claim, epochs, canaries)
    _opacus_run(data, 8.0, epochs, canaries, noise_factor=0.9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", nargs="+", choices=["limits", "fp", "mnist", "opacus"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--canaries", type=int, default=5000)
    ap.add_argument("--models", nargs="+", default=["dp-dense", "dp-cnn"])
    ap.add_argument("--final-canaries", type=int, default=5000, help="crafted-final canaries (at most the quiet coordinates)")
    a = ap.parse_args()
    if "limits" in a.parts:
        limits(a.epochs, a.canaries)
    if "fp" in a.parts:
        false_positives()
    if "mnist" in a.parts:
        mnist(a.epochs, a.canaries, a.models, a.final_canaries)
    if "opacus" in a.parts:
        opacus(a.epochs, a.canaries)


if __name__ == "__main__":
    main()
