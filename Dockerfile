FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tally tally
COPY dashboard dashboard
COPY alerts alerts
COPY consumers consumers
RUN pip install --no-cache-dir .
COPY . .
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
