"""Fitted calibrations that ship with semhealth: ``<encoder>.json``, one per encoder.

Data, not code: ``semhealth.embeddings.calibration.load_calibration`` reads them, and
``bench/fit_calibration.py`` writes them.
"""
