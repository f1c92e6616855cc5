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
# `make run [RUN_CONF=nginx-conf/X.conf] [PORT=8081] [RUN_DIR=dir]`: nginx's
# -c is resolved against its -p, so the configuration is named absolutely.
RUN_DIR      ?= $(BUILD)/run
RUN_CONF     ?= nginx-conf/example.conf
PORT         ?= 8080
RUN_PREFIX    = $(abspath $(RUN_DIR))
RUN_CONF_ABS  = $(abspath $(RUN_CONF))
CARGO        ?= cargo

# Debian packages the build, the tests and the benchmark need.
APT_PACKAGES := nginx nginx-dev libclang-dev pkg-config libssl-dev libpcre2-dev zlib1g-dev redis-server openssl prometheus python3-prometheus-client nghttp2-client memcached
# What `make deb` needs on top (lintian checks the package in `make test`).
DEB_APT_PACKAGES := debhelper dpkg-dev lintian

# `make deb`: libnginx-mod-http-rl (debian/), into build/deb.
DEB_OUT      := $(BUILD)/deb
DEB_VERSION  = $(shell dpkg-parsechangelog -l debian/changelog -SVersion)
DEB_FILE     = $(DEB_OUT)/libnginx-mod-http-rl_$(DEB_VERSION)_$(shell dpkg --print-architecture).deb

# `make build NGINX_SRC=/path/to/nginx-1.x.y [NGINX_CONFIGURE="..."]`: the
# module for any nginx source tree, configured (in a copy, under build/)
# with NGINX_CONFIGURE; into build/nginx-1.x.y/ngx_http_rl_module.so.
NGINX_CONFIGURE ?= --with-compat
ifdef NGINX_SRC
SRC_VERSION  := $(shell sed -n 's/^\#define NGINX_VERSION *"\(.*\)"/\1/p' $(NGINX_SRC)/src/core/nginx.h)
SRC_DIR      := $(BUILD)/nginx-$(SRC_VERSION)
SRC_SO       := $(SRC_DIR)/$(MODULE)
# Its own target directory: another nginx's headers rebuild the crates above nginx-sys.
SRC_TARGET   ?= $(ROOT)/target/nginx-$(SRC_VERSION)
endif

# The `make build NGINX_SRC=` test: nginx 1.28 from the nginx-src crate,
# configured as nginx.org's packages are (their modules and compiler flags;
# paths and user left at nginx's defaults, the test gives its own).
ORG_CRATE    = $(shell sed -n '/^name = "nginx-src"/{n;s/^version = "\(.*\)"/\1/p}' Cargo.lock)
ORG_SRC      = $(shell ls -d $(or $(CARGO_HOME),$(HOME)/.cargo)/registry/src/*/nginx-src-$(ORG_CRATE)/nginx 2>/dev/null | head -1)
ORG_VERSION  = $(shell sed -n 's/^\#define NGINX_VERSION *"\(.*\)"/\1/p' $(ORG_SRC)/src/core/nginx.h)
ORG_DIR      := $(BUILD)/nginx-org
ORG_BIN      := $(ORG_DIR)/nginx
ORG_CONFIGURE := --with-compat --with-file-aio --with-threads --with-http_addition_module \
	--with-http_auth_request_module --with-http_dav_module --with-http_flv_module --with-http_gunzip_module \
	--with-http_gzip_static_module --with-http_mp4_module --with-http_random_index_module \
	--with-http_realip_module --with-http_secure_link_module --with-http_slice_module --with-http_ssl_module \
	--with-http_stub_status_module --with-http_sub_module --with-http_v2_module --with-http_v3_module \
	--with-mail --with-mail_ssl_module --with-stream --with-stream_realip_module --with-stream_ssl_module \
	--with-stream_ssl_preread_module \
	--with-cc-opt='-g -O2 -fstack-protector-strong -Wformat -Werror=format-security -Wp,-D_FORTIFY_SOURCE=2 -fPIC' \
	--with-ld-opt='-Wl,-z,relro -Wl,-z,now -Wl,--as-needed -pie'

# The links in /etc/nginx/modules-enabled (what the system's nginx loads).
MODULES_ENABLED = find /etc/nginx/modules-enabled -mindepth 1 -maxdepth 1 -printf '%f -> %l\n' 2>/dev/null | sort

# `make dist`: the source tarball, with Cargo.lock and the dependencies vendored.
DIST_NAME    = nginx-rl-$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

.PHONY: all help deps deps-deb build build-debian build-src build-vendored install deb dist run stop check test unittest test-core test-listed test-integration test-make test-package test-build-src test-dist bench bench-quick soak clean

all: build

help:
	@echo "make build        the module for Debian's nginx: $(DEBIAN_SO)"
	@echo "make build NGINX_SRC=/path/to/nginx-1.x.y [NGINX_CONFIGURE=\"...\"]  the module for that nginx (default --with-compat): build/nginx-1.x.y/"
	@echo "make deb          the Debian package libnginx-mod-http-rl: $(DEB_OUT)"
	@echo "make dist         the source tarball, dependencies vendored (builds with cargo --frozen): $(BUILD)/dist"
	@echo "make build-vendored  the module and nginx 1.28 (ngx's vendored feature): $(VENDORED_DIR)"
	@echo "make install      copy the Debian build to $(MODULES_DIR)"
	@echo "make run          nginx on 127.0.0.1:$(PORT) with $(RUN_CONF) (RUN_CONF=nginx-conf/X.conf, PORT=8081, RUN_DIR=$(RUN_DIR)); make stop ends it"
	@echo "make check        cargo fmt --check and clippy -D warnings on both crates"
	@echo "make unittest     rl-core's tests (no nginx)"
	@echo "make test         build both targets, unit and integration tests, make's own (a rebuild under a running nginx, make run with every recipe), the package (root), a build for nginx 1.28 as nginx.org packages it, a quick bench"
	@echo "make bench        nginx-rl against limit_req and Lua + Redis (bench/RESULTS.md, ~35 min)"
	@echo "make soak         the reliability suite in minutes: a million-key soak, reload storm, kill -9 (~10 min; SOAK_QUICK=1: ~1 min)"
	@echo "make clean        remove build outputs"

# put_file SRC DEST MODE: SRC to DEST as a new file renamed over DEST, and
# only if it differs. Never written into DEST: a running nginx has the module
# (or its binary) mapped from that file, and new bytes in it are new code
# under the running workers, which die on SIGSEGV with every request. A
# renamed file leaves them the old one until nginx reloads or restarts.
define put_file
	@mkdir -p $(dir $(2))
	cmp -s $(1) $(2) || { install -m $(3) $(1) $(2).new.$$$$ && mv -f $(2).new.$$$$ $(2); }
endef

# apt-get installs whichever of the packages $(1) are missing.
define apt_install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef

deps:
	$(call apt_install,$(APT_PACKAGES))

deps-deb:
	$(call apt_install,$(DEB_APT_PACKAGES))

# Debian's nginx source, configured with the flags the packaged binary was
# built with (a module built otherwise is "not binary compatible").
$(DEBIAN_OBJS)/ngx_auto_config.h:
	rm -rf $(DEBIAN_SRC) && mkdir -p $(BUILD)
	cp -r /usr/share/nginx/src $(DEBIAN_SRC)
	cd $(DEBIAN_SRC) && source ./conf_flags && ./configure "$${NGX_CONF_FLAGS[@]}" > $(BUILD)/configure-debian.log

ifdef NGINX_SRC
build: build-src
else
build: build-debian
endif

build-debian: deps $(DEBIAN_OBJS)/ngx_auto_config.h
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) build --release
	$(call put_file,target/release/libngx_http_rl_module.so,$(DEBIAN_SO),0644)

# The module against $(NGINX_SRC), configured with $(NGINX_CONFIGURE) in a
# copy (configured again when the arguments change).
build-src: deps
	@test -n "$(NGINX_SRC)" -a -n "$(SRC_VERSION)" || { echo "NGINX_SRC=$(NGINX_SRC): no nginx source (src/core/nginx.h) there"; exit 1; }
	@if [ "$$(cat $(SRC_DIR)/configure-args 2>/dev/null)" != "$(NGINX_CONFIGURE)" ] || [ ! -f $(SRC_DIR)/src/objs/ngx_auto_config.h ]; then \
		set -e; rm -rf $(SRC_DIR) && mkdir -p $(SRC_DIR) && cp -r $(NGINX_SRC) $(SRC_DIR)/src; \
		cd $(SRC_DIR)/src; conf=./configure; [ -x $$conf ] || conf=auto/configure; \
		echo "configuring nginx $(SRC_VERSION): $(NGINX_CONFIGURE)"; \
		eval "$$conf $(NGINX_CONFIGURE)" > $(SRC_DIR)/configure.log; \
		echo "$(NGINX_CONFIGURE)" > $(SRC_DIR)/configure-args; \
	fi
	NGINX_BUILD_DIR=$(SRC_DIR)/src/objs CARGO_TARGET_DIR=$(SRC_TARGET) $(CARGO) build --release
	$(call put_file,$(SRC_TARGET)/release/libngx_http_rl_module.so,$(SRC_SO),0644)
	@echo "built $(SRC_SO) for nginx $(SRC_VERSION) configured with: $(NGINX_CONFIGURE)"

# nginx 1.28 built by nginx-src (through nginx-sys), and the module against it.
# auth_request, which the ngx crate's nginx leaves out: tests/auth.rs and
# the plan-from-authentication example need it.
build-vendored: deps
	NGX_CONFIGURE_ARGS=--with-http_auth_request_module CARGO_TARGET_DIR=$(ROOT)/target/vendored $(CARGO) build --release --features vendored
	$(call put_file,target/vendored/release/libngx_http_rl_module.so,$(VENDORED_SO),0644)
	$(call put_file,"$$(ls -t target/vendored/release/build/nginx-sys-*/out/objs/nginx | head -1)",$(VENDORED_BIN),0755)

install: build-debian
	$(call put_file,$(DEBIAN_SO),$(MODULES_DIR)/$(MODULE),0644)

# libnginx-mod-http-rl, built by debian/rules as Debian builds its
# libnginx-mod-* (dh_nginx), reusing build-debian's build when there is one;
# the .deb, .buildinfo and .changes into build/deb (not dpkg's default, ..).
deb: deps deps-deb
	rm -rf $(DEB_OUT) && mkdir -p $(DEB_OUT)
	DEB_DESTDIR=$(DEB_OUT) CARGO=$(CARGO) dpkg-buildpackage -b -us -uc \
		--buildinfo-option=-u$(DEB_OUT) --buildinfo-file=$(DEB_OUT)/libnginx-mod-http-rl_$(DEB_VERSION).buildinfo \
		--changes-option=-u$(DEB_OUT) --changes-file=$(DEB_OUT)/libnginx-mod-http-rl_$(DEB_VERSION).changes
	@ls -l $(DEB_OUT)

# nginx (Debian's) on 127.0.0.1:$(PORT) with $(RUN_CONF) in $(RUN_DIR);
# `make stop` ends it. The configuration runs as a copy in $(RUN_DIR) with
# its 127.0.0.1:8080 turned into 127.0.0.1:$(PORT) (the recipes of
# nginx-conf/ listen there, and name every other file from the prefix). A
# port already taken is told at once: nginx would retry the bind for a while
# and then fail with "Address already in use".
run: build-debian stop
	@test -f $(RUN_CONF_ABS) || { echo "make run: $(RUN_CONF_ABS): no such file"; exit 1; }
	@if timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$(PORT)' 2>/dev/null; then \
		echo "make run: 127.0.0.1:$(PORT) is in use; choose another port: make run PORT=$$(($(PORT) + 1))"; exit 1; fi
	mkdir -p $(RUN_PREFIX)/html/api $(RUN_PREFIX)/logs
	ln -sfn $(dir $(DEBIAN_SO)) $(RUN_PREFIX)/modules
	echo "hello from nginx-rl" > $(RUN_PREFIX)/html/index.html
	echo '{"ok":true}' > $(RUN_PREFIX)/html/api/index.json
	sed 's/127\.0\.0\.1:8080\b/127.0.0.1:$(PORT)/g' $(RUN_CONF_ABS) > $(RUN_PREFIX)/nginx.conf
	/usr/sbin/nginx -p $(RUN_PREFIX)/ -c $(RUN_PREFIX)/nginx.conf -e logs/error.log -t
	/usr/sbin/nginx -p $(RUN_PREFIX)/ -c $(RUN_PREFIX)/nginx.conf -e logs/error.log
	@echo "nginx-rl is serving $(RUN_CONF) on http://127.0.0.1:$(PORT)/ (try: curl -i http://127.0.0.1:$(PORT)/api/); stop it with: make stop$(if $(filter command line,$(origin RUN_DIR)), RUN_DIR=$(RUN_DIR))"

# Waits for the master to exit: a `make run` right after reuses its port.
stop:
	@if [ -f $(RUN_PREFIX)/nginx.pid ]; then \
		pid=$$(cat $(RUN_PREFIX)/nginx.pid); kill $$pid 2>/dev/null || true; \
		for i in $$(seq 50); do kill -0 $$pid 2>/dev/null || break; sleep 0.1; done; \
		rm -f $(RUN_PREFIX)/nginx.pid; fi

# Formatting and lints, both crates (clippy reads nginx's headers: Debian's, configured).
check: deps $(DEBIAN_OBJS)/ngx_auto_config.h
	$(CARGO) fmt --all -- --check
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) clippy --release --workspace --all-targets -- -D warnings

test: test-listed build-debian build-vendored test-core test-integration test-make test-package test-build-src bench-quick

unittest: test-core

test-core:
	$(CARGO) test -p rl-core --release

# The integration tests start their own nginx (and redis-server) on loopback
# ports, once against Debian's nginx and once against the vendored 1.28.
INTEGRATION := --test integration --test identity --test dry_run --test variables --test queue --test reliability --test conf_check --test redis --test redis_late --test misbehaving --test mixed --test auth --test sentinel --test resolver --test metrics --test quota --test version --test plans --test dashboard --test recipes --test header_clients --test applied_once --test lease --test lease_lines --test conn --test conn_redis --test limit_conn --test priority --test shedding --test memcached --test misbehaving_memcached

# The test files with targets of their own (test-package, test-build-src).
OWN_TARGET_TESTS := package nginx_src

# Every tests/*.rs runs in `make test`: in INTEGRATION or in a target of its
# own (a file left out of both lists would never run, as conn_redis.rs did
# not for four CI runs).
test-listed:
	@missing=$$(for f in tests/*.rs; do t=$$(basename "$$f" .rs); \
		case " $(INTEGRATION) $(OWN_TARGET_TESTS:%=--test %) " in *" --test $$t "*) ;; *) echo "$$t" ;; esac; \
	done); \
	if [ -n "$$missing" ]; then \
		echo "test-listed: tests/*.rs that make test does not run:" $$missing "(add them to INTEGRATION)"; exit 1; \
	fi

test-integration:
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) RL_NGINX=/usr/sbin/nginx RL_MODULE=$(DEBIAN_SO) \
		$(CARGO) test --release $(INTEGRATION) -- --test-threads=2
	NGINX_BUILD_DIR=$(DEBIAN_OBJS) RL_NGINX=$(VENDORED_BIN) RL_MODULE=$(VENDORED_SO) \
		$(CARGO) test --release $(INTEGRATION) -- --test-threads=2

# The tests that run make themselves (a cargo test cannot: it may hold the
# build directory's lock while its tests run): a rebuild under a running
# nginx (tests/rebuild.sh), and `make run` with every recipe of nginx-conf/
# as documented, another PORT, a port in use (tests/make_run.sh).
test-make: build-debian
	bash tests/rebuild.sh
	bash tests/make_run.sh

# The package (tests/package.rs): its contents, lintian, and installed beside
# Debian's nginx (root; skips where the package or a module file is there).
test-package: deb
	RL_DEB=$(DEB_FILE) NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) test --release --test package -- --test-threads=2

# `make build NGINX_SRC=` against nginx 1.28 from the nginx-src crate
# (tests/nginx_src.rs): the nginx binary configured as nginx.org's packages
# are (built once, reused while its arguments are the same), the module
# configured with the default --with-compat alone, built separately (in
# target/vendored, whose dependencies build-vendored has built), loaded into
# it; and Debian's 1.22 build refused by it.
test-build-src: deps build-debian
	@test -n "$(ORG_SRC)" || { echo "no nginx-src crate under ~/.cargo/registry/src (make build-vendored fetches it)"; exit 1; }
	@if [ "$$(cat $(ORG_DIR)/configure-args 2>/dev/null)" != "$(ORG_CONFIGURE)" ] || [ ! -x $(ORG_BIN) ]; then \
		set -e; rm -rf $(ORG_DIR) && mkdir -p $(ORG_DIR) && cp -r $(ORG_SRC) $(ORG_DIR)/src; \
		echo "building nginx $(ORG_VERSION) as nginx.org packages it (log: $(ORG_DIR)/build.log)"; \
		cd $(ORG_DIR)/src && auto/configure $(ORG_CONFIGURE) > $(ORG_DIR)/build.log && $(MAKE) -j2 >> $(ORG_DIR)/build.log 2>&1; \
		install -m 0755 objs/nginx $(ORG_BIN).new && mv -f $(ORG_BIN).new $(ORG_BIN) && echo "$(ORG_CONFIGURE)" > $(ORG_DIR)/configure-args; \
	fi
	$(MAKE) build NGINX_SRC=$(ORG_SRC) SRC_TARGET=$(ROOT)/target/vendored
	RL_NGINX=$(ORG_BIN) RL_MODULE=$(BUILD)/nginx-$(ORG_VERSION)/$(MODULE) RL_OTHER_NGINX=/usr/sbin/nginx RL_OTHER_MODULE=$(DEBIAN_SO) \
		NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) test --release --test nginx_src -- --test-threads=2

# The release tarball: the sources of HEAD (git archive: commit first), with
# Cargo.lock and every dependency vendored (vendor/, and .cargo/config.toml
# pointing cargo there), so that it builds offline: cargo build --frozen.
dist:
	@git diff --quiet HEAD || echo "warning: uncommitted changes are not in the tarball (it is made from HEAD)"
	rm -rf $(BUILD)/dist && mkdir -p $(BUILD)/dist
	git archive --format=tar --prefix=$(DIST_NAME)/ HEAD | tar -x -C $(BUILD)/dist
	cd $(BUILD)/dist/$(DIST_NAME) && mkdir -p .cargo && $(CARGO) vendor --locked vendor > .cargo/config.toml 2> $(BUILD)/dist/vendor.log \
		|| { cat $(BUILD)/dist/vendor.log; exit 1; }
	grep -q '^directory = "vendor"' $(BUILD)/dist/$(DIST_NAME)/.cargo/config.toml
	tar -C $(BUILD)/dist --sort=name --owner=0 --group=0 --numeric-owner --mtime="$$(git log -1 --format=@%ct)" \
		-czf $(BUILD)/dist/$(DIST_NAME).tar.gz $(DIST_NAME)
	rm -rf $(BUILD)/dist/$(DIST_NAME)
	@ls -l $(BUILD)/dist/$(DIST_NAME).tar.gz

# The tarball builds with no network and no cargo cache (an empty CARGO_HOME):
# once, by hand (a full build, several minutes).
test-dist: dist build-debian
	rm -rf $(BUILD)/dist-check && mkdir -p $(BUILD)/dist-check/cargo-home
	tar -xzf $(BUILD)/dist/$(DIST_NAME).tar.gz -C $(BUILD)/dist-check
	cd $(BUILD)/dist-check/$(DIST_NAME) && CARGO_HOME=$(BUILD)/dist-check/cargo-home CARGO_NET_OFFLINE=true \
		NGINX_BUILD_DIR=$(DEBIAN_OBJS) $(CARGO) build --release --frozen
	@echo "the tarball built offline: $(BUILD)/dist-check/$(DIST_NAME)/target/release/libngx_http_rl_module.so"

# nginx-rl against the no-limiter baseline, limit_req and Lua + Redis:
# bench/RESULTS.md (about 35 minutes); QUICK=1: one short round, a smoke test.
# Then, as bench/run.sh runs bench/profile.sh (not with QUICK=1, nor with
# BENCH_NO_PROFILE=1), what the Redis script costs redis-server under
# callgrind: bench/REDIS_PROFILE.md (a few minutes).
bench: build-debian
	@$(MODULES_ENABLED) > $(BUILD)/modules-enabled.before
	QUICK=$(QUICK) RL_MODULE=$(DEBIAN_SO) bash bench/run.sh
	$(if $(QUICK)$(BENCH_NO_PROFILE),,CARGO=$(CARGO) bash bench/redis_profile.sh)
	@$(MODULES_ENABLED) | diff -u --label before --label after $(BUILD)/modules-enabled.before - || \
		{ echo "bench: /etc/nginx/modules-enabled changed: the system's nginx would load other modules"; exit 1; }

# The smoke test `make test` runs: fails if any scenario misbehaves, or if
# what the system's nginx loads changed (the Lua peer's packages link
# themselves into /etc/nginx/modules-enabled; bench/run.sh must take back
# what its install added).
bench-quick: build-debian
	@$(MODULES_ENABLED) > $(BUILD)/modules-enabled.before
	QUICK=1 RL_MODULE=$(DEBIAN_SO) BENCH_OUT=$(BUILD)/bench-quick.md bash bench/run.sh
	@$(MODULES_ENABLED) | diff -u --label before --label after $(BUILD)/modules-enabled.before - || \
		{ echo "bench-quick: /etc/nginx/modules-enabled changed: the system's nginx would load other modules"; exit 1; }
	@echo "bench-quick: /etc/nginx/modules-enabled as it was"

# The standing reliability suite (bench/soak.sh, ~10 min): a million-key soak
# with the workers' RSS sampled, and the reliability tests with RL_SOAK=5
# (their loops five times longer); one summary table, non-zero exit on a FAIL.
# SOAK_QUICK=1: about a minute. Knobs: SOAK_MINUTES, RL_SOAK, see bench/soak.sh.
soak: build-debian
	SOAK_QUICK=$(SOAK_QUICK) RL_MODULE=$(DEBIAN_SO) NGINX_BUILD_DIR=$(DEBIAN_OBJS) CARGO=$(CARGO) bash bench/soak.sh

clean: stop
	$(CARGO) clean
	rm -rf $(BUILD)
