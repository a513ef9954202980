FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tally tally
COPY dashboard dashboard
COPY alerts alerts
COPY consumers consumers
RUN pip install --no-cache-dir ".[spark]"
COPY . .
# Static files are collected at build time and served by WhiteNoise from gunicorn (DEBUG stays off).
# The build's throwaway key signs nothing; the running containers need SECRET_KEY (docker-compose.yml).
RUN TALLY_DEVELOPMENT=1 python manage.py collectstatic --noinput -v 0
# Everything in the image runs as production: SECRET_KEY required, secure cookies, HSTS (docs/security.md).
ENV PYTHONUNBUFFERED=1 TALLY_DEVELOPMENT=0 DEBUG=false
EXPOSE 8000
