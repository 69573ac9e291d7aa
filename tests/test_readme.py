"""Every Python example in the README runs as written.

The blocks of one `## ` section run together, in order, as one script (a later block may use
names from an earlier one). Blocks fenced as ```python no-run need files only a user has
(their own checkpoints); what they call is tested elsewhere.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / 'README.md'


def section_scripts():
    scripts = {}
    for section in re.split(r'^## ', README.read_text(encoding='utf-8'), flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        blocks = re.findall(r'^```python\n(.*?)^```', section, flags=re.M | re.S)
        if blocks:
            scripts[title] = '\n'.join(blocks)
    return scripts


SCRIPTS = section_scripts()


def test_the_readme_has_examples():
    assert {'Quick start', 'Attention as a block inside a CNN', 'Pretrained ViT', 'Variants'} <= set(SCRIPTS)


@pytest.mark.parametrize('title', sorted(SCRIPTS))
def test_readme_section_examples_run(title, tmp_path):
    script = tmp_path / 'example.py'
    script.write_text('import matplotlib\nmatplotlib.use("Agg")\n' + SCRIPTS[title], encoding='utf-8')
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f'README section {title!r} failed:\n{result.stderr[-3000:]}'
