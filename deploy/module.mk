# module.mk: installing flashsale (included by the top Makefile).
#
#   make install [PREFIX=/usr/local] [DESTDIR=...] [SYSCONFDIR=/etc]
#       $(PREFIX)/bin/{flashsale,flashload,flashlock}
#       $(PREFIX)/share/man/man1/*.1      their --help as man pages (help2man)
#       $(PREFIX)/share/doc/flashsale/    openapi.yaml, api.md, metrics.md, README.md,
#                                         flashsale.env.example, prometheus/ (the
#                                         rules, their tests, an example config),
#                                         and docs/, lock/README.md and
#                                         loadtest/README.md where the README's
#                                         links point
#       $(PREFIX)/lib/systemd/system/flashsale.service
#                                         ExecStart and EnvironmentFile
#                                         rewritten for PREFIX and SYSCONFDIR
#       $(SYSCONFDIR)/flashsale/flashsale.env   only if there is none yet
#                                         (an operator's edits are kept)
#   make uninstall   removes all of it but the environment file
#
# DESTDIR stages the tree elsewhere (packaging, tests): paths inside the
# installed files are those of PREFIX and SYSCONFDIR, without DESTDIR.

PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
BINDIR     := $(PREFIX)/bin
MAN1DIR    := $(PREFIX)/share/man/man1
DOCDIR     := $(PREFIX)/share/doc/flashsale
UNITDIR    := $(PREFIX)/lib/systemd/system
ENVDIR     := $(SYSCONFDIR)/flashsale

INSTALL_PROGRAMS := flashsale flashload flashlock
MAN_PAGES        := $(patsubst %,$(BUILD)/man/%.1,$(INSTALL_PROGRAMS))

MAN_NAME_flashsale := flash-sale order service: orders over HTTP, stock in Redis or SQLite, never oversold
MAN_NAME_flashload := load generator and invariant verifier for flashsale
MAN_NAME_flashlock := run a command under a Redis lock, like flock(1) across machines

# The man pages are the programs' own --help and --version (help2man), so
# they cannot say something else than the programs do.
$(BUILD)/man/%.1: $(BIN)/%
	@mkdir -p $(dir $@)
	@command -v help2man >/dev/null || { \
	    echo "install: help2man is missing (tools/deps.sh installs it)" >&2; exit 1; }
	help2man --no-info --no-discard-stderr --name='$(MAN_NAME_$*)' --output=$@ $<

.PHONY: install uninstall man
man: $(MAN_PAGES)

install: $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(MAN_PAGES)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MAN1DIR) $(DESTDIR)$(DOCDIR) \
	    $(DESTDIR)$(UNITDIR) $(DESTDIR)$(ENVDIR)
	install -m 755 $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(DESTDIR)$(BINDIR)
	install -m 644 $(MAN_PAGES) $(DESTDIR)$(MAN1DIR)
	install -m 644 docs/openapi.yaml docs/api.md docs/metrics.md README.md $(DESTDIR)$(DOCDIR)
	install -d $(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(DOCDIR)/lock $(DESTDIR)$(DOCDIR)/loadtest
	install -m 644 $(wildcard docs/*.md) docs/openapi.yaml $(DESTDIR)$(DOCDIR)/docs
	install -m 644 lock/README.md $(DESTDIR)$(DOCDIR)/lock
	install -m 644 loadtest/README.md $(DESTDIR)$(DOCDIR)/loadtest
	install -d $(DESTDIR)$(DOCDIR)/prometheus
	install -m 644 $(wildcard deploy/prometheus/*.yml) $(DESTDIR)$(DOCDIR)/prometheus
	install -m 644 deploy/systemd/flashsale.env $(DESTDIR)$(DOCDIR)/flashsale.env.example
	sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/etc/flashsale/|$(ENVDIR)/|g' \
	    deploy/systemd/flashsale.service > $(DESTDIR)$(UNITDIR)/flashsale.service.tmp
	chmod 644 $(DESTDIR)$(UNITDIR)/flashsale.service.tmp
	mv $(DESTDIR)$(UNITDIR)/flashsale.service.tmp $(DESTDIR)$(UNITDIR)/flashsale.service
	@if [ -e $(DESTDIR)$(ENVDIR)/flashsale.env ]; then \
	    echo "install: keeping $(DESTDIR)$(ENVDIR)/flashsale.env"; \
	else \
	    install -m 600 deploy/systemd/flashsale.env $(DESTDIR)$(ENVDIR)/flashsale.env; \
	    echo "install: wrote $(DESTDIR)$(ENVDIR)/flashsale.env"; \
	fi

uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALL_PROGRAMS)) \
	    $(patsubst %,$(DESTDIR)$(MAN1DIR)/%.1,$(INSTALL_PROGRAMS)) \
	    $(DESTDIR)$(UNITDIR)/flashsale.service
	rm -rf $(DESTDIR)$(DOCDIR)
	@echo "uninstall: left $(DESTDIR)$(ENVDIR)/flashsale.env in place"
