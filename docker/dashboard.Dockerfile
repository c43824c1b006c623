# optuna-dashboard on tiletune's database: every job's Optuna study ("tiletune-job-<id>-<time>").
FROM python:3.11-slim

RUN pip install --no-cache-dir 'optuna-dashboard>=0.17' 'optuna>=5.0' 'psycopg[binary]>=3.1'
EXPOSE 8080
CMD ["sh", "-c", "optuna-dashboard --host 0.0.0.0 --port 8080 \"$OPTUNA_STORAGE\""]
