import sys

from onnx2bir.cli import main

sys.exit(main())
