"""Prediction server: TTFT/TPOT predictions for LLM-serving schedulers from the newest model version.

Run with ``python -m prediction_server``; ``app.create_app(settings)`` builds the ASGI app.
"""
