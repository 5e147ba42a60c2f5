#!/usr/bin/env python
"""Print, as a JSON list, the docker images the given releases' specs use for MODEL@DEVICE pairs (tests only).

    spec_images.py --specs tests/fixtures/specs --release v0.18.0 --release v0.20.0 Qwen3-32B@p300x2 ...

The specs are the real release_model_spec.json exports in tests/fixtures/specs; names are resolved as the
collection resolves them (plugins/module_utils/_ttis: catalog.load_spec_file + derive.resolve), so the lab's stand-in
image is tagged with exactly the images the serve role will ask Docker for.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import catalog as ttis_catalog
from ansible_collections.ttfleet.inference.plugins.module_utils._ttis import derive as ttis_derive


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default=os.path.join(ROOT, "tests", "fixtures", "specs"))
    parser.add_argument("--release", action="append", required=True)
    parser.add_argument("pairs", nargs="+", metavar="MODEL@DEVICE")
    args = parser.parse_args(argv)
    images = []
    for release in args.release:
        catalog = ttis_catalog.load_spec_file(os.path.join(args.specs, f"release_model_spec-{release}.json.gz"))
        for pair in args.pairs:
            model, _sep, device = pair.rpartition("@")
            image = ttis_derive.resolve(catalog, model, device)["docker_image"]
            if image not in images:
                images.append(image)
    print(json.dumps(images))


if __name__ == "__main__":
    main()
