"""Probes: LGIP, PR-MCS perturbation robustness, SPECS specificity, compositional suites."""
from capscore.probes.formats import LOADERS, SuiteItem, load_suite
from capscore.probes.run import ProbeItem, ProbeResult, run_lgip, run_perturb, run_specificity, run_suite
from capscore.probes.segment import detail_units

__all__ = ["LOADERS", "SuiteItem", "load_suite", "ProbeItem", "ProbeResult", "run_lgip", "run_perturb",
           "run_specificity", "run_suite", "detail_units"]
