#!/bin/sh
# test_browser.sh — the page of `berth serve` (runtime/faces/web/) in headless Chromium
# (Debian's chromium, driven by Debian's python3-selenium through Debian's chromedriver,
# all installed by `make deps`; nothing is downloaded) against a real berth serve
# and sandboxd (provider $BERTH_PROVIDER, default bwrap) with the scripted model.
# tests/browser/test_page.py prints the cmocka-style lines tests/run.sh counts;
# screenshots at 1280 and 360 px go to $BUILD/browser/.  Also checks that
# runtime/faces/web/assets.c was regenerated from the page's files.
set -u
BUILD=${BUILD:-build}
export BUILD
. tests/lib/shtest.sh

test_assets_c_is_generated_from_the_page() {
    python3 runtime/faces/web/embed.py --check
}
run assets_c_is_generated_from_the_page
echo "[  PASSED  ] $passed test(s)."
[ -n "$failed_names" ] && echo "[  FAILED  ] 1 test(s), listed below:" && echo "[  FAILED  ]$failed_names"

# No silent skip: without the browser or the driver the suite fails and says why.
# Debian's python3 by its path: a python3 earlier on the PATH may lack Debian's selenium.
for need in /usr/bin/chromium /usr/bin/chromedriver /usr/lib/python3/dist-packages/selenium \
            "$BUILD/berth" "$BUILD/sandboxd"; do
    if [ ! -e "$need" ]; then
        echo "missing $need (run make deps and make all)"
        echo "[  FAILED  ] 1 test(s), listed below:"
        echo "[  FAILED  ] browser_suite"
        exit 1
    fi
done
timeout 240 /usr/bin/python3 tests/browser/test_page.py || exit 1
[ -z "$failed_names" ]
