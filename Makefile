# nginx-rl: build the module for Debian's nginx (default) and for nginx 1.28
# from the ngx crate's `vendored` feature, run it, test it.

SHELL        := /bin/bash
ROOT         := $(abspath .)
BUILD        := $(ROOT)/build
DEBIAN_SRC   := $(BUILD)/nginx-debian
DEBIAN_OBJS  := $(DEBIAN_SRC)/objs
MODULE       := ngx_http_rl_module.so
DEBIAN_SO    := $(BUILD)/debian/$(MODULE)
VENDORED_DIR := $(BUILD)/vendored
VENDORED_SO  := $(VENDORED_DIR)/$(MODULE)
VENDORED_BIN := $(VENDORED_DIR)/nginx
MODULES_DIR  := /usr/lib/nginx/modules
RUN_DIR      := $(BUILD)/run
RUN_CONF     ?= $(ROOT)/nginx-conf/example.conf
CARGO        ?= cargo

# Debian packages the build, the tests and the benchmark need.
APT_PACKAGES := nginx nginx-dev libclang-dev pkg-config libssl-dev libpcre2-dev zlib1g-dev redis-server openssl prometheus python3-prometheus-client

.PHONY: all help deps build build-debian build-vendored install run stop check test unittest test-core test-integration bench bench-quick soak clean

all: build

help:
	@echo "make build        the module for Debian's nginx: $(DEBIAN_SO)"
	@echo "make build-vendored  the module and nginx 1.28 (ngx's vendored feature): $(VENDORED_DIR)"
	@echo "make install      copy the Debian build to $(MODULES_DIR)"
	@echo "make run          nginx on 127.0.0.1:8080 with $(RUN_CONF); make stop ends it"
	@echo "make check        cargo fmt --check and clippy -D warnings on both crates"
	@echo "make unittest     rl-core's tests (no nginx)"
	@echo "make test         build both targets, unit and integration tests, a quick bench"
	@echo "make bench        nginx-rl against limit_req and Lua + Redis (bench/RESULTS.md, ~20 min)"
	@echo "make soak         the reliability suite in minutes: a million-key soak, reload storm, kill -9 (~10 min; SOAK_QUICK=1: ~1 min)"
	@echo "make clean        remove build outputs"

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Debian's nginx source, configured with the flags the packaged binary was
# built with (a module built otherwise is "not binary compatible").
$(DEBIAN_OBJS)/ngx_auto_config.h:
	rm -rf $(DEBIAN_SRC) && mkdir -p $(BUILD)
	cp -r /usr/share/nginx/src $(DEBIAN_SRC)
	cd $(DEBIAN_SRC) && source ./conf_flags && ./configure "$${NGX_CONF_FLAGS[@]}" > $(BUILD)/configure-debian.log

build: build-debian

build-debian: deps $(DEBIAN_OBJS)/ngx_auto_config.h
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) build --release
	mkdir -p $(dir $(DEBIAN_SO)) && cp target/release/libngx_http_rl_module.so $(DEBIAN_SO)

# nginx 1.28 built by nginx-src (through nginx-sys), and the module against it.
build-vendored: deps
	CARGO_TARGET_DIR=$(ROOT)/target/vendored $(CARGO) build --release --features vendored
	mkdir -p $(VENDORED_DIR)
	cp target/vendored/release/libngx_http_rl_module.so $(VENDORED_SO)
	cp "$$(ls -t target/vendored/release/build/nginx-sys-*/out/objs/nginx | head -1)" $(VENDORED_BIN)

install: build-debian
	install -m 0644 $(DEBIAN_SO) $(MODULES_DIR)/$(MODULE)

# nginx (Debian's) on 127.0.0.1:8080 with an example configuration; `make stop` ends it.
run: build-debian stop
	mkdir -p $(RUN_DIR)/html/api $(RUN_DIR)/logs
	ln -sfn $(dir $(DEBIAN_SO)) $(RUN_DIR)/modules
	echo "hello from nginx-rl" > $(RUN_DIR)/html/index.html
	echo '{"ok":true}' > $(RUN_DIR)/html/api/index.json
	/usr/sbin/nginx -p $(RUN_DIR)/ -c $(RUN_CONF) -e logs/error.log -t
	/usr/sbin/nginx -p $(RUN_DIR)/ -c $(RUN_CONF) -e logs/error.log
	@echo "nginx-rl is serving on http://127.0.0.1:8080/ (try: curl -i http://127.0.0.1:8080/api/); stop it with: make stop"

stop:
	@if [ -f $(RUN_DIR)/nginx.pid ]; then kill $$(cat $(RUN_DIR)/nginx.pid) 2>/dev/null || true; sleep 0.5; rm -f $(RUN_DIR)/nginx.pid; fi

# Formatting and lints, both crates (clippy reads nginx's headers: Debian's, configured).
check: deps $(DEBIAN_OBJS)/ngx_auto_config.h
	$(CARGO) fmt --all -- --check
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) clippy --release --workspace --all-targets -- -D warnings

test: build-debian build-vendored test-core test-integration bench-quick

unittest: test-core

test-core:
	$(CARGO) test -p rl-core --release

# The integration tests start their own nginx (and redis-server) on loopback
# ports, once against Debian's nginx and once against the vendored 1.28.
INTEGRATION := --test integration --test identity --test dry_run --test variables --test queue --test reliability --test conf_check --test redis --test redis_late --test misbehaving --test mixed --test sentinel --test metrics

test-integration:
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) RL_NGINX=/usr/sbin/nginx RL_MODULE=$(DEBIAN_SO) \
		$(CARGO) test --release $(INTEGRATION) -- --test-threads=2
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) RL_NGINX=$(VENDORED_BIN) RL_MODULE=$(VENDORED_SO) \
		$(CARGO) test --release $(INTEGRATION) -- --test-threads=2

# nginx-rl against the no-limiter baseline, limit_req and Lua + Redis:
# bench/RESULTS.md (about 20 minutes); QUICK=1: one short round, a smoke test.
bench: build-debian
	QUICK=$(QUICK) RL_MODULE=$(DEBIAN_SO) bash bench/run.sh

# The smoke test `make test` runs: fails if any scenario misbehaves.
bench-quick: build-debian
	QUICK=1 RL_MODULE=$(DEBIAN_SO) BENCH_OUT=$(BUILD)/bench-quick.md bash bench/run.sh

# The standing reliability suite (bench/soak.sh, ~10 min): a million-key soak
# with the workers' RSS sampled, and the reliability tests with RL_SOAK=5
# (their loops five times longer); one summary table, non-zero exit on a FAIL.
# SOAK_QUICK=1: about a minute. Knobs: SOAK_MINUTES, RL_SOAK, see bench/soak.sh.
soak: build-debian
	SOAK_QUICK=$(SOAK_QUICK) RL_MODULE=$(DEBIAN_SO) NGINX_BUILD_DIR=$(DEBIAN_OBJS) CARGO=$(CARGO) bash bench/soak.sh

clean: stop
	$(CARGO) clean
	rm -rf $(BUILD)
