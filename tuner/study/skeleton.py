"""The run behind `moetune tune`, training and serving alike: `run(options, mode)`.

One tuner process of a study, over a mode (tuner/study/modes.py: `TrainMode`, `ServeMode`):
1. screening (`mode.screen`): the cost model over the realizable plan space (training: on Ray actors);
2. pre-registration (tuner/study/prereg.py): the baseline and the candidates with their predictions,
   written once, exclusively and self-hashed, before the first trial; a rerun verifies it instead;
3. trials (tuner/study/loop.py `TrialLoop`): the baseline, the pre-registered plans, then the guided
   sampler's proposals, in an Optuna study (tuner/study/storage.py); after every measured trial the
   calibration is refitted and the rest re-ranked;
4. adjudication: the pre-registered protocol's re-measurement (`TrialLoop.remeasure`, when the mode
   pre-registers one) and the verdict (tuner.study.report.adjudicate);
5. the mode's report, its storage URL shown with the password redacted.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from specs.errors import UsageError
from tuner.rank.candidates import select_candidates
from tuner.study import prereg as prereg_mod
from tuner.study import storage as study_mod
from tuner.study.modes import SAMPLER, Screening, StudyMode
from tuner.study.options import TuneOptions, TuneResult

logger = logging.getLogger(__name__)


def existing_preregistration(study_dir: Path, study: str, workload) -> dict | None:
    """The verified pre-registration in `study_dir`, None if there is none; UsageError if it does
    not verify or belongs to another study or workload."""
    if not (study_dir / prereg_mod.NAME).exists():
        return None
    try:
        doc = prereg_mod.load(study_dir)
    except prereg_mod.PreregistrationError as e:
        raise UsageError(str(e)) from None
    if doc["study"] != study or doc["hashes"]["model_spec_sha256"] != workload.model.digest() \
            or doc["hashes"]["cluster_sha256"] != workload.cluster.digest():
        raise UsageError(f"{study_dir} holds a different study/workload; use another --study-dir")
    return doc


def preregister(options: TuneOptions, mode: StudyMode, screening: Screening) -> dict:
    """Choose the baseline and the candidates, and register them; returns the registered document
    (another tuner's, if it registered first). The tables digest is that of the tables the
    predictions used (the mode's)."""
    baseline, source = mode.baseline(options)
    cands = select_candidates(screening.pool, options.n_preregister, layout=mode.layout)
    doc = prereg_mod.build(
        study=options.study, workload=mode.workload, precision=mode.precision,
        plans=[{"rank": i + 1, **mode.entry(c)} for i, c in enumerate(cands)],
        baseline=baseline, baseline_source=source, tables_digest=mode.tables.digest, calibration=mode.calibration,
        trials_budget=options.trials, sampler=SAMPLER, adjudication=mode.adjudication(options),
        space=screening.space, workload_fields=mode.workload_fields())
    try:
        prereg_mod.write(options.study_dir, doc)
    except prereg_mod.PreregistrationError:  # another tuner process registered first
        return prereg_mod.load(options.study_dir)
    logger.info("pre-registered %d plans + baseline: %s (sha256 %s...)", len(cands),
                options.study_dir / prereg_mod.NAME, doc["sha256"][:16])
    return doc


def run(options: TuneOptions, mode: StudyMode) -> TuneResult:
    """Run (or resume) the study of `options` over `mode` (what is tuned, with the cost model's
    tables and the calibration to start from; the calibration is refitted on every measured trial).

    Returns:
        TuneResult with the report's path and the verdict line (None for predict-only). Raises
        UsageError (an InputError) for a study folder holding another study, or when no plan fits.
    """
    import ray

    from tuner.study.loop import TrialLoop, start_ray
    from tuner.study.report import adjudicate
    t0 = time.monotonic()
    study_dir = Path(options.study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    storage_url = study_mod.redact_url(options.storage or study_mod.default_storage_url(study_dir))
    existing = existing_preregistration(study_dir, options.study, mode.workload)
    started = start_ray(mode.workload, options.ray_address, options.dashboard, options.ray_no_auth)
    try:
        screening = mode.screen(options)
        if existing is None:
            prereg = preregister(options, mode, screening)
        else:
            prereg = existing
            logger.info("resuming: pre-registration %s verified (sha256 %s...)", study_dir / prereg_mod.NAME,
                        prereg["sha256"][:16])
        # every tuner of a shared study names the registration it runs under (one, whoever wrote it)
        logger.info("study %s: pre-registration sha256 %s", options.study, prereg["sha256"])
        storage = study_mod.open_storage(options.storage, study_dir, heartbeat_interval=options.heartbeat_interval_s)
        study = study_mod.open_study(options.study, storage)
        study.set_user_attr("preregistration_sha256", prereg["sha256"])
        study.set_user_attr("mode", mode.name)
        report = dict(prereg=prereg, backend=options.backend, storage_url=storage_url)
        if options.backend == "predict-only":
            path = mode.write_report(study_dir, rows=study_mod.trial_rows(study), calibration=mode.calibration,
                                     cal_report=None, wall_s=time.monotonic() - t0, remeasured=[],
                                     pool=screening.pool, **report)
            return TuneResult(path, None)
        loop = TrialLoop(study, storage, mode=mode, prereg=prereg, sampler=mode.sampler(screening.pool),
                         options=options)
        loop.screen_rate = (screening.total, screening.seconds)
        loop.run()
        remeasured = loop.remeasure()
        rows = study_mod.trial_rows(study)
        path = mode.write_report(study_dir, rows=rows, calibration=loop.calibration, cal_report=loop.cal_report,
                                 wall_s=time.monotonic() - t0, remeasured=remeasured, pool=None, **report)
        return TuneResult(path, adjudicate(rows, prereg, remeasured)["line"])
    finally:
        if started:
            ray.shutdown()
