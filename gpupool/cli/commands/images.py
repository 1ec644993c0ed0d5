"""`gpupool images`: the environment images the description declares, each with its
declaration's digest and the reference it is pushed as, or one image's Containerfile."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from gpupool.cli.output import EXIT_OK, UsageError, emit_json, out, table
from gpupool.cli.registry import command
from gpupool.render import environment_image
from gpupool.spec.errors import did_you_mean
from gpupool.spec.model import Description


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", metavar="HOST[:PORT]",
                   help="the registry the references name (default: registry.<pool domain>)")
    p.add_argument("--containerfile", metavar="NAME",
                   help="print the Containerfile of image NAME")


@command("images", _setup)
def cmd_images(args: argparse.Namespace, desc: Description) -> int:
    registry = args.registry or environment_image.default_registry(desc)
    try:
        images = environment_image.render(desc, registry)
    except ValueError as exc:
        raise UsageError(f"--registry: {exc}") from None
    if args.containerfile is not None:
        found = next((i for i in images if i.name == args.containerfile), None)
        if found is None:
            names = [i.name for i in images]
            hint = did_you_mean(args.containerfile, names)
            raise UsageError(f"--containerfile: no environment image {args.containerfile!r}"
                             + (f"; {hint}" if hint else "")
                             + f"; declared: {', '.join(names) or 'none'}")
        if args.json:
            emit_json(asdict(found))
        else:
            sys.stdout.write(found.containerfile)
        return EXIT_OK
    if args.json:
        emit_json({"pool": desc.pool.name, "registry": registry,
                   "images": [{k: v for k, v in asdict(i).items() if k != "containerfile"}
                              for i in images]})
        return EXIT_OK
    out.print(table(f"Environment images of pool {desc.pool.name}",
                    ["image", "version", "digest", "reference"],
                    [[i.name, i.version, i.digest, i.reference] for i in images], None))
    return EXIT_OK
