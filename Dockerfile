# Headroom operator image. Build: docker build -t headroom:0.1.0 .
# The install steps live in hack/image/install.sh; tests/e2e/test_image_recipe.py
# runs the same script in fresh virtualenvs, since no engine exists in CI.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements ./requirements
COPY operator ./operator
COPY hack/image/install.sh /usr/local/bin/headroom-install
RUN headroom-install build /src /wheels

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HEADROOM_CONFIG=/etc/headroom/config.yaml
COPY --from=build /wheels /wheels
COPY hack/image/install.sh /usr/local/bin/headroom-install
RUN headroom-install runtime /wheels && rm -rf /wheels /usr/local/bin/headroom-install
USER 65532:65532
EXPOSE 8443 8081
ENTRYPOINT ["headroom", "run"]
