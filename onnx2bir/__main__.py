import sys

from onnx2bir.cli.commands import main

sys.exit(main())
