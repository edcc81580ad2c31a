"""The ground floor, imported by every folder and importing none: ``core/flags.py``, the flag declarations
(``Feature``, ``call_hook``, the one-line-error ``Parser``, shared argument types) and ``UserError``, the one-line
error every layer raises for bad input."""
