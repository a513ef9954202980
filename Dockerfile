# One Dockerfile, two images (docs/deploy.md):
#   docker build -t tally:spark .                              workers: a JRE, PySpark and the JDBC jar
#   docker build -t tally:web --build-arg WITH_SPARK=false .   web and beat: no JRE, no PySpark
FROM python:3.11-slim
ARG WITH_SPARK=true
RUN if [ "$WITH_SPARK" = "true" ]; then \
        apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
        && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tally tally
COPY dashboard dashboard
COPY alerts alerts
COPY consumers consumers
# rdkafka (confluent-kafka, one wheel) in both images: workers may run librdkafka pipelines, and the web app's doors
# check that the client a pipeline chooses is installed.
RUN if [ "$WITH_SPARK" = "true" ]; then pip install --no-cache-dir ".[spark,rdkafka]"; else pip install --no-cache-dir ".[rdkafka]"; fi
COPY . .
# Static files are collected at build time and served by WhiteNoise from gunicorn (DEBUG stays off).
# The build's throwaway key signs nothing; the running containers need SECRET_KEY (docker-compose.yml).
RUN TALLY_DEVELOPMENT=1 python manage.py collectstatic --noinput -v 0
# Everything in the image runs as production: SECRET_KEY required, secure cookies, HSTS (docs/security.md).
ENV PYTHONUNBUFFERED=1 TALLY_DEVELOPMENT=0 DEBUG=false
EXPOSE 8000
