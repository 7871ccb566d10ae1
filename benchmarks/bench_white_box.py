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
  heads   dp-rvfl's DP-SGD head on MNIST (the one loop, dpaudit.mechanisms.dpsgd.white_box_target.head_white_box_run)
          at claims 2 and 8, and the noise x 0.9 at claim 8.
  loop    a plain PyTorch loop recorded with PipelineCheck (the example script's SmallCNN, Poisson batches,
          its own clipping and noise; clip(clipped=), noise(noisy=)) at claims 2 and 8, and its noise x 0.9.
  fp-loops  false positives end to end: --replicates correct runs each of a tiny plain loop and a tiny
          dp-rvfl head (digits), each run's confidence event (s_hi < sigma, d_lo > 1 or q_lo > q) counted
          (without it eps_LB <= the claim: its rate bounds the false-positive rate).

--jax PATH (jax_privacy's auditing.py, loaded from that file; needs dp_accounting) adds jax_privacy's
estimators on the SAME observations: white-box rows, ``CanaryScoreAuditor(in = y at the steps with the
canary, out = y at the steps without)``: epsilon_clopper_pearson (one-sided, Bonferroni) and
epsilon_from_gdp of ONE step (the Gaussian mechanism, conditional on inclusion; significance 2/3 of
1 - confidence), each turned into its noise multiplier (exact Gaussian mechanism) and composed like
eps_LB with dpaudit's q_lo (the last third) over T steps; beside them the per-step epsilon of the claim
and of dpaudit's s_hi / d_lo. Its one-run estimators do not apply there (inclusion is Bernoulli(q), not
a fair coin). Crafted-final rows: epsilon_one_run and epsilon_one_run_fdp on the final displacements of
the inserted vs the withheld canaries (fair coins: their setting).

Usage:
  DPAUDIT_DATA_DIR=../shared/data .venv/bin/python benchmarks/bench_white_box.py limits fp mnist [--epochs 1] [--canaries 5000] [--final-canaries 5000]
      [--jax /tmp/jax_privacy_auditing.py]
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
            sigma = calibrate_noise_multiplier(
                target_epsilon=claim, delta=DELTA, sample_rate=0.005, steps=steps, accountant="rdp"
            ).noise_multiplier
            ev = SubsampledGaussian(sigma, 0.005, steps)
            step = wb.expected_step_bound(ev, canaries, delta=DELTA)
            final = wb.expected_final_bound(ev, canaries, delta=DELTA)
            r = wb.gdp_mu_ratio(ev)
            print(
                f"limit claim {claim} T {steps} sigma {sigma:.4f} M {canaries}: white-box {step:.3f} ({step / claim:.3f}), "
                f"crafted-final {final:.3f} ({final / claim:.3f}); GDP mu trajectory {r['mu_trajectory']:.3f}, "
                f"final sum {r['mu_final']:.3f}, ratio {r['ratio']:.3f}",
                flush=True,
            )


def false_positives(replicates: int = 1000) -> None:
    rng = np.random.default_rng(0)
    step_flags = final_flags = 0
    for _ in range(replicates):
        s_hi, d_lo, q_lo = wb.step_statistics(
            wb.simulate_steps(rng, noise=0.8, rate=0.1, steps=50, canaries=20), 0.95
        )
        step_flags += (d_lo <= 0 or s_hi / d_lo < 0.8) or q_lo > 0.1
        s_hi, d_lo = wb.final_statistics(
            wb.simulate_final(rng, noise=0.8, rate=0.05, steps=50, canaries=200), 0.05, 0.95
        )
        final_flags += d_lo > 0 and s_hi / d_lo < 0.8
    print(
        f"false positives over {replicates} replicates (upper bound: the monotonicity event): white-box {step_flags / replicates:.3f}, "
        f"crafted-final {final_flags / replicates:.3f}",
        flush=True,
    )


def _pld_note(b) -> str:
    """eps_LB and the claim by the tight pld accountant (eps_LB then bounds the true epsilon)."""
    lb = wb.family_epsilon(
        b.noise_upper,
        b.sensitivity_lower,
        b.sample_rate_lower,
        b.steps,
        delta=DELTA,
        accountant="pld",
    )
    claimed = wb.family_epsilon(
        b.claimed.noise_multiplier,
        1.0,
        b.claimed.sample_rate,
        b.steps,
        delta=DELTA,
        accountant="pld",
    )
    return f"pld: eps_LB {lb:.3f} of true eps {claimed:.3f} ({lb / claimed:.3f})"


def _jax_note(jax, obs, b) -> str:
    """jax_privacy's estimators on the same observations (module docstring); '' without --jax."""
    if jax is None:
        return ""
    if b.threat_model == "crafted-final":
        aud = jax.CanaryScoreAuditor(obs.values[obs.included], obs.values[~obs.included])
        sig = 1.0 - b.confidence
        one, fdp = aud.epsilon_one_run(sig, DELTA), aud.epsilon_one_run_fdp(sig, DELTA)
        return f"; jax_privacy one-run {one:.3f} ({one / b.claimed_epsilon:.3f}), one-run f-DP {fdp:.3f} ({fdp / b.claimed_epsilon:.3f})"
    from dpaudit.audits.gaussian import calibrate_exact, exact_epsilon

    sig = (1.0 - b.confidence) * 2.0 / 3.0
    aud = jax.CanaryScoreAuditor(obs.values[obs.sampled], obs.values[~obs.sampled])
    t0 = time.perf_counter()
    step = {"CP": aud.epsilon_clopper_pearson(sig, DELTA), "GDP": aud.epsilon_from_gdp(sig, DELTA)}
    took = time.perf_counter() - t0
    ours = (
        exact_epsilon(b.noise_upper / b.sensitivity_lower, DELTA)
        if b.sensitivity_lower > 0
        else 0.0
    )
    parts = []
    for name, e in step.items():
        total = (
            wb.family_epsilon(
                calibrate_exact(e, DELTA),
                1.0,
                b.sample_rate_lower,
                b.steps,
                delta=DELTA,
                accountant=b.accountant,
            )
            if e > 0
            else 0.0
        )
        parts.append(
            f"{name} step {e:.3f} -> composed {total:.3f} ({total / b.claimed_epsilon:.3f})"
        )
    claim_step = exact_epsilon(b.claimed.noise_multiplier, DELTA)
    return (
        f"; jax_privacy on the same observations: {', '.join(parts)} [{took:.1f} s]; per-step eps: claim "
        f"{claim_step:.3f}, dpaudit s_hi/d_lo {ours:.3f}"
    )


def _report(name, bound, limit, sigma, secs, jax, obs, extra="") -> None:
    b = bound
    print(
        f"{name} T {b.steps}: eps_LB {b.epsilon_lb:.3f} (claimed {b.claimed_epsilon:.3f}, ratio {b.ratio:.3f}, limit "
        f"{limit:.3f}), violation {b.violation}; sigma_hi {b.noise_upper:.4f} (sigma {sigma:.4f}), d_lo "
        f"{b.sensitivity_lower:.4f}, q_lo {b.sample_rate_lower:.5f}; {_pld_note(b)}{extra}; {secs:.0f} s"
        f"{_jax_note(jax, obs, b)}",
        flush=True,
    )


def _run(
    model, data, claim, epochs, canaries, threat_model="white-box", noise_factor=1.0, jax=None
):
    from dpaudit.mechanisms.dpsgd.one_run_modules import module_config
    from dpaudit.mechanisms.dpsgd.white_box_target import white_box_run
    from dpaudit.noise import NoiseSource

    cfg, event = module_config(model, data, epsilon=claim, delta=DELTA, epochs=epochs)
    restore = _planted_noise(noise_factor)  # the claim keeps the calibrated sigma
    try:
        t0 = time.perf_counter()
        run = white_box_run(
            model,
            data,
            cfg,
            canaries=canaries,
            noise=NoiseSource(),
            seed=1,
            threat_model=threat_model,
        )
        train_s = time.perf_counter() - t0
    finally:
        restore()
    bound = (wb.step_bound if threat_model == "white-box" else wb.final_bound)(
        run.observations, claimed=event, delta=DELTA
    )
    limit = (wb.expected_step_bound if threat_model == "white-box" else wb.expected_final_bound)(
        event, canaries, delta=DELTA
    )
    _report(
        f"{model} {threat_model} claim {claim} noise x{noise_factor} M {canaries}",
        bound,
        limit,
        cfg.noise_multiplier,
        train_s,
        jax,
        run.observations,
        f"; quiet coordinates {run.info['quiet_coordinates']}",
    )


def mnist(epochs: int, canaries: int, models, final_canaries: int, jax=None) -> None:
    from dpaudit.data import load_dataset

    data = load_dataset("mnist")
    for model in models:
        for claim in (2.0, 8.0):
            _run(model, data, claim, epochs, canaries, jax=jax)
        _run(model, data, 8.0, epochs, canaries, noise_factor=0.9, jax=jax)
    if "dp-dense" in models:
        for claim in (2.0, 8.0):
            _run(
                "dp-dense",
                data,
                claim,
                epochs,
                final_canaries,
                threat_model="crafted-final",
                jax=jax,
            )


def _planted_noise(noise_factor: float):
    """The planted understatement: the one noise filler draws ``noise_factor`` times the claimed std."""
    from dpaudit.mechanisms.dpsgd import core as dpsgd_core

    real = dpsgd_core.gaussian_filler
    if noise_factor != 1.0:
        dpsgd_core.gaussian_filler = lambda noise, out, std: real(noise, out, noise_factor * std)
    return lambda: setattr(dpsgd_core, "gaussian_filler", real)


def _head_run(target, canaries, noise_factor=1.0, jax=None, seed=1):
    from dpaudit.mechanisms.dpsgd.white_box_target import head_white_box_run
    from dpaudit.noise import NoiseSource

    restore = _planted_noise(noise_factor)
    try:
        t0 = time.perf_counter()
        run = head_white_box_run(target, canaries=canaries, noise=NoiseSource(), seed=seed)
        secs = time.perf_counter() - t0
    finally:
        restore()
    event = target.claimed_event
    bound = wb.step_bound(
        run.observations, claimed=event, delta=target.delta, claimed_epsilon=target.claimed_epsilon
    )
    return run, bound, secs


def heads(epochs: int, canaries: int, jax=None) -> None:
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    for claim, factor in ((2.0, 1.0), (8.0, 1.0), (8.0, 0.9)):
        target = HeadTarget(model="dp-rvfl", dataset="mnist", epsilon=claim, epochs=epochs)
        target.prepare()
        run, bound, secs = _head_run(target, canaries, factor, jax)
        limit = wb.expected_step_bound(target.claimed_event, canaries, delta=DELTA)
        _report(
            f"dp-rvfl head white-box claim {claim} noise x{factor} M {canaries}",
            bound,
            limit,
            target._config.noise_multiplier,
            secs,
            jax,
            run.observations,
        )


def _linear_clipped_sum(model, params, xb, yb, c):
    """Closed-form per-sample gradients of a linear model under squared loss to one-hot labels, each
    clipped to joint norm c (||r|| sqrt(||x||^2 + 1)) and summed: a cheap loop for many replicates."""
    w, b = params["weight"], params["bias"]
    r = xb @ w.T + b - torch.nn.functional.one_hot(yb, w.shape[0])
    factor = torch.clamp(c / torch.sqrt(r.square().sum(1) * (xb.square().sum(1) + 1.0)), max=1.0)
    rf = r * factor[:, None]
    return {"weight": rf.T @ xb, "bias": rf.sum(0)}


def _plain_loop(
    model,
    x,
    y,
    *,
    sigma,
    q,
    steps,
    canaries,
    noise_factor=1.0,
    null=False,
    seed=0,
    lr=0.1,
    clipped_sum=None,
):
    """A user's plain DP-SGD loop recorded with PipelineCheck (Poisson batches from its own generator,
    ``clipped_sum`` as its clipping (default dpaudit's per-sample helper), its own Gaussian noise at
    ``noise_factor`` times the declared std, SGD on the noisy sum over m0 = N q); returns the check."""
    from dpaudit.mechanisms.dpsgd.core import per_sample_clipped_sum

    from dpaudit.integrations.pipeline import PipelineCheck
    from dpaudit.integrations.white_box import LoopWhiteBox

    n, c = len(y), 1.0
    check = PipelineCheck(
        noise_multiplier=sigma, sample_rate=q, steps=steps, max_grad_norm=c, dataset_size=n
    )
    LoopWhiteBox(
        model,
        canaries=canaries,
        tensors=["fc1.weight"] if hasattr(model, "fc1") else ["weight"],
        seed=seed,
        null=null,
    ).watch(check)
    gen = torch.Generator().manual_seed(int(np.random.default_rng().integers(2**62)))
    params = dict(model.named_parameters())
    for _ in range(steps):
        idx = torch.nonzero(torch.rand(n, generator=gen) < q).reshape(-1)
        detached = {k: p.detach() for k, p in params.items()}
        summed = (
            (clipped_sum or per_sample_clipped_sum)(model, detached, x[idx], y[idx], c)
            if len(idx)
            else {k: torch.zeros_like(p) for k, p in detached.items()}
        )
        check.clip(len(idx), c, clipped=summed)
        noisy = {
            k: s + noise_factor * sigma * c * torch.randn(s.shape, generator=gen)
            for k, s in summed.items()
        }
        check.noise(sigma, c, noisy=noisy)
        with torch.no_grad():
            for k, p in params.items():
                p -= lr * noisy[k] / (n * q)
        check.step()
    return check


def loop(epochs: int, canaries: int, jax=None) -> None:
    from dpaudit.accounting.calibration import calibrate_noise_multiplier
    from dpaudit.data import load_dataset

    example = _example()
    data = load_dataset("mnist")
    x, y = torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train)
    q = 256 / len(y)
    steps = int(round(epochs / q))
    for claim, factor in ((2.0, 1.0), (8.0, 1.0), (8.0, 0.9)):
        sigma = calibrate_noise_multiplier(
            target_epsilon=claim, delta=DELTA, sample_rate=q, steps=steps, accountant="rdp"
        ).noise_multiplier
        torch.manual_seed(0)
        t0 = time.perf_counter()
        check = _plain_loop(
            example.SmallCNN(),
            x,
            y,
            sigma=sigma,
            q=q,
            steps=steps,
            canaries=canaries,
            noise_factor=factor,
        )
        secs = time.perf_counter() - t0
        wbox = check.canaries
        bound = wbox.audit(delta=DELTA)
        codes = [f["code"] for f in check.record(DELTA)["findings"]]
        _report(
            f"plain loop (PipelineCheck, SmallCNN) white-box claim {claim} noise x{factor} M {canaries}",
            bound,
            wb.expected_step_bound(wbox.claim(), canaries, delta=DELTA),
            sigma,
            secs,
            jax,
            wbox.observations(),
            f"; findings {codes}",
        )


def _missed(obs, sigma: float, q: float) -> bool:
    """The bound's confidence event failed: s_hi < sigma, d_lo > 1 or q_lo > q (the true values). Without
    it eps_LB <= the claim (monotonicity), so its rate bounds the false-positive rate."""
    s_hi, d_lo, q_lo = wb.step_statistics(obs, 0.95)
    return s_hi < sigma or d_lo > 1.0 or q_lo > q


def fp_loops(replicates: int) -> None:
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
    from dpaudit.mechanisms.dpsgd.white_box_target import head_white_box_run
    from dpaudit.noise import NoiseSource

    x, y = (
        torch.randn(200, 40, generator=torch.Generator().manual_seed(0)),
        torch.randint(0, 30, (200,)),
    )
    sigma, q, steps = 1.0, 0.1, 20
    t0 = time.perf_counter()
    misses = sum(
        _missed(
            _plain_loop(
                torch.nn.Linear(40, 30),
                x,
                y,
                sigma=sigma,
                q=q,
                steps=steps,
                canaries=200,
                seed=r,
                clipped_sum=_linear_clipped_sum,
            ).canaries.observations(),
            sigma,
            q,
        )
        for r in range(replicates)
    )
    print(
        f"false positives, plain loop (Linear 40x30, squared loss, N 200, q {q}, T {steps}, M 200), {replicates} "
        f"correct runs ({time.perf_counter() - t0:.0f} s): confidence event failed {misses / replicates:.3f}",
        flush=True,
    )
    target = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=4.0, epochs=1)
    target.prepare()
    cfg = target._config
    t0 = time.perf_counter()
    misses = sum(
        _missed(
            head_white_box_run(target, canaries=200, noise=NoiseSource(), seed=r).observations,
            cfg.noise_multiplier,
            cfg.sample_rate,
        )
        for r in range(replicates)
    )
    print(
        f"false positives, dp-rvfl head (digits, claim 4, q {cfg.sample_rate}, T {cfg.steps}, M 200), {replicates} "
        f"correct runs ({time.perf_counter() - t0:.0f} s): confidence event failed {misses / replicates:.3f}",
        flush=True,
    )


def _example():
    """The example Opacus script as a module (its SmallCNN)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "example", Path(__file__).parent.parent / "examples" / "opacus_one_run_mnist.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _opacus_run(
    data, claim: float, epochs: int, canaries: int, noise_factor: float = 1.0, jax=None
) -> None:
    """The example script's model and loop (examples/opacus_one_run_mnist.py: SmallCNN, Adam, batch 256, Poisson
    sampling, make_private_with_epsilon), with :class:`OpacusWhiteBox` attached; ``noise_factor`` lowers the
    optimizer's noise multiplier after attach (the claim keeps the calibrated one)."""
    from opacus import PrivacyEngine

    from dpaudit.integrations.white_box import OpacusWhiteBox

    example = _example()
    torch.manual_seed(0)
    model = example.SmallCNN()
    wbox = OpacusWhiteBox(model, canaries=canaries, seed=0, tensors=["fc1.weight"])
    train = torch.utils.data.TensorDataset(
        torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train)
    )
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        data_loader=torch.utils.data.DataLoader(train, batch_size=256),
        max_grad_norm=1.0,
        epochs=epochs,
        target_epsilon=claim,
        target_delta=DELTA,
    )
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
    _report(
        f"opacus example white-box claim {claim} noise x{noise_factor} M {canaries}",
        wbox.audit(delta=DELTA),
        wb.expected_step_bound(wbox.claim(), canaries, delta=DELTA),
        sigma,
        train_s,
        jax,
        wbox.observations(),
    )


def opacus(epochs: int, canaries: int, jax=None) -> None:
    from dpaudit.data import load_dataset

    data = load_dataset("mnist")
    for claim in (2.0, 8.0):
        _opacus_run(data, claim, epochs, canaries, jax=jax)
    _opacus_run(data, 8.0, epochs, canaries, noise_factor=0.9, jax=jax)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "parts", nargs="+", choices=["limits", "fp", "mnist", "opacus", "heads", "loop", "fp-loops"]
    )
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--canaries", type=int, default=5000)
    ap.add_argument("--models", nargs="+", default=["dp-dense", "dp-cnn"])
    ap.add_argument(
        "--final-canaries",
        type=int,
        default=5000,
        help="crafted-final canaries (at most the quiet coordinates)",
    )
    ap.add_argument(
        "--replicates", type=int, default=1000, help="fp-loops: correct runs of each loop"
    )
    ap.add_argument(
        "--jax",
        default="",
        help="path of jax_privacy's auditing.py: its estimators on the same observations",
    )
    a = ap.parse_args()
    from eps_lb_validity import load_jax

    jax = load_jax(a.jax) if a.jax else None
    if "limits" in a.parts:
        limits(a.epochs, a.canaries)
    if "fp" in a.parts:
        false_positives()
    if "mnist" in a.parts:
        mnist(a.epochs, a.canaries, a.models, a.final_canaries, jax)
    if "opacus" in a.parts:
        opacus(a.epochs, a.canaries, jax)
    if "heads" in a.parts:
        heads(a.epochs, a.canaries, jax)
    if "loop" in a.parts:
        loop(a.epochs, a.canaries, jax)
    if "fp-loops" in a.parts:
        fp_loops(a.replicates)


if __name__ == "__main__":
    main()
