#!/usr/bin/python3
"""openapi_json.py: docs/openapi.yaml as JSON, for the service to embed and
serve at GET /openapi.json, and for the tests to validate responses with.

YAML says more than JSON can: timestamps, non-string keys, anchors that
make cycles. The loader here refuses all of that (a status code must be
written '200', a time "2026-11-22T09:36:42.057Z"), so what the service
serves is exactly what the YAML says, and a slip fails the build with a
line number instead of becoming a different document.

Usage: openapi_json.py IN.yaml OUT.json
As a module: load(path) -> the document as plain dicts, lists, str, int,
float, bool and None.
"""
import json
import os
import sys

import yaml  # Debian's python3-yaml


class StrictLoader(yaml.SafeLoader):
    """SafeLoader minus the implicit types JSON has no word for."""


# Plain scalars that look like dates stay strings.
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping(loader, node):
    loader.flatten_mapping(node)
    out = {}
    for k, v in node.value:
        key = loader.construct_object(k, deep=True)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, "key %r is not a string (quote it)" % (key,), k.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, "duplicate key %r" % key, k.start_mark)
        out[key] = loader.construct_object(v, deep=True)
    return out


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    json.dumps(doc)                                # anything else left: fail here
    return doc


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: openapi_json.py IN.yaml OUT.json")
    try:
        doc = load(sys.argv[1])
    except (yaml.YAMLError, TypeError, ValueError) as e:
        sys.exit("openapi_json.py: %s: %s" % (sys.argv[1], e))
    text = json.dumps(doc, indent=1, ensure_ascii=True) + "\n"
    tmp = sys.argv[2] + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, sys.argv[2])


if __name__ == "__main__":
    main()
