/* version.h: the version of this build, for every program's --version.
 *
 * Stamped at build time by tools/version.sh (git describe of the checkout,
 * or the VERSION file of a tarball) into build/<variant>/gen/version.c, so
 * a binary says which source it came from without anyone editing a number. */
#ifndef FLASHSALE_VERSION_H
#define FLASHSALE_VERSION_H

/* "v1.2-3-gabc1234-dirty", "abc1234", or the VERSION file's text. */
extern const char flashsale_version[];

#endif
