"""Compatibility re-exports: the audit now lives in ``engine.audit.{config,design,runner,report}``."""
from engine.audit.config import AUDIT_MODELS, THRESHOLDS, AuditConfig, algorithm_keys, load_audit_config  # noqa: F401
from engine.audit.report import AuditReport, compact_summary, summary_table  # noqa: F401
from engine.audit.runner import cli_audit, load_array, prepare_audit, preview_audit, run_audit  # noqa: F401
