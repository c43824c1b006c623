"""The tiletune service: SQL storage of workloads, trials and tuned configs, and its FastAPI app."""
