"""Every Python example in the README and in the manual (`docs/*.md`) runs as written, the README's model
list names every registered model, and every link between the pages leads somewhere.

The blocks of one `## ` section of a page run together, in order, as one script (a later block may use
names from an earlier one); the blocks before a page's first `## ` form a section of their own, named by
its `# ` title. The sections of a page run one after another in one process, each in a namespace of its
own, and a failure names its section (one process per page: a process per section imports torch 36 times
instead of 12, 122 s of CPU time for this file against 88 s, measured on the shared machine). Blocks fenced as ```python no-run need files only a user has (their own
checkpoints); what they call is tested elsewhere.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vit_pytorch.models import MODELS

ROOT = Path(__file__).parent.parent
README = ROOT / 'README.md'
DOCS = sorted((ROOT / 'docs').glob('*.md'))
PAGES = [README] + DOCS


def name(page):
    return page.relative_to(ROOT).as_posix()


def sections(page):
    """(title, text) of each `## ` section of a page, the text before the first one titled by the `# ` title."""
    text = page.read_text(encoding='utf-8')
    preamble, *rest = re.split(r'^## ', text, flags=re.M)
    title = re.search(r'^# (.*)$', preamble, flags=re.M)
    found = [(title.group(1).strip() if title else '', preamble)]
    return found + [(section.splitlines()[0].strip(), section) for section in rest]


def section_scripts():
    """{page: [(section title, its blocks as one script)]} for every page with examples."""
    scripts = {}
    for page in PAGES:
        for title, text in sections(page):
            blocks = re.findall(r'^```python\n(.*?)^```', text, flags=re.M | re.S)
            if blocks:
                scripts.setdefault(name(page), []).append((title, '\n'.join(blocks)))
    return scripts


SCRIPTS = section_scripts()

RUNNER = """
import json, sys, traceback
import matplotlib
matplotlib.use('Agg')
failed = []
for title, script in json.load(open(sys.argv[1], encoding='utf-8')):
    try:
        exec(compile(script, title, 'exec'), {'__name__': '__main__'})
    except BaseException:
        traceback.print_exc()
        failed.append(title)
if failed:
    sys.exit('sections failed: ' + '; '.join(failed))
"""


def test_the_pages_have_examples():
    found = {f'{page}: {title}' for page, scripts in SCRIPTS.items() for title, _ in scripts}
    assert {'README.md: Quick start', 'docs/vit.md: Attention as a block inside a CNN', 'docs/vit.md: Pretrained ViT',
            'docs/variants.md: CaiT', 'docs/multi-scale.md: Swin Transformer', 'docs/loading.md: Fine-tuning at 384',
            'docs/pretraining.md: Self-supervised pre-training', 'docs/looking-inside.md: Looking inside'} <= found


def test_every_python_block_is_collected():
    # a ```python fence the collector does not see (indented, or with another word after it) would never run
    for page in PAGES:
        text = page.read_text(encoding='utf-8')
        fences = re.findall(r'^\s*```python(.*)$', text, flags=re.M)
        assert all(rest.strip() in ('', 'no-run') for rest in fences), name(page)
        assert len(re.findall(r'^```python(?: no-run)?\n', text, flags=re.M)) == len(fences), name(page)


@pytest.mark.parametrize('page', sorted(SCRIPTS))
def test_page_examples_run(page, tmp_path):
    sections_file = tmp_path / 'sections.json'
    sections_file.write_text(json.dumps([[f'{page}: {title}', script] for title, script in SCRIPTS[page]]),
                             encoding='utf-8')
    (tmp_path / 'run.py').write_text(RUNNER, encoding='utf-8')
    result = subprocess.run([sys.executable, 'run.py', str(sections_file)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f'{page}:\n{result.stderr[-4000:]}'


def readme_section(title):
    return dict(sections(README))[title]


def test_the_readme_lists_every_registered_model():
    listed = set(re.findall(r'^\| `(\w+)` \|', readme_section('Models'), flags=re.M))
    assert listed == set(MODELS), (f'registered but not in the README: {sorted(set(MODELS) - listed)}; '
                                   f'in the README but not registered: {sorted(listed - set(MODELS))}')


def test_the_readme_gives_the_registry_tables_counts():
    """The README's summary of docs/registry-table.md is that table's own summary line, count for count."""
    table = (ROOT / 'docs' / 'registry-table.md').read_text()
    summary = re.search(r'^(\d+) models: (\d+) at or above 1\.0x, (\d+) at parity .*?, (\d+) below, (\d+) without a '
                        r'reference measured', table, flags=re.M)
    readme = re.search(r'all (\d+) models measured on [^:]*: (\d+) at or above 1\.0x, (\d+) at parity, (\d+) below '
                       r'\([^)]*\), (\d+) without a reference', README.read_text())
    assert summary and readme, 'a summary line was not found'
    assert readme.groups() == summary.groups(), (readme.groups(), summary.groups())


def test_the_readme_lists_the_wrappers():
    models = readme_section('Models')
    for wrapper in ('mae.MAE', 'simmim.SimMIM', 'mpp.MPP', 'dino.Dino', 'distill.DistillWrapper',
                    'accept_video_wrapper.AcceptVideoWrapper', 'recorder.Recorder', 'mp3.MP3', 'lejepa.LeJEPA',
                    'levjepa.LeVJEPA', 'levjepa_nd.LeVJEPAND'):
        assert f'`vit_pytorch.{wrapper}' in models, wrapper


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r'\]\((docs/[\w.-]+\.md)[#)]', README.read_text(encoding='utf-8')))
    assert linked == {name(page) for page in DOCS}


def slug(heading):
    # GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'
    heading = heading.strip().lower().replace('`', '')
    return re.sub(r'[^\w\- ]', '', heading).replace(' ', '-')


def anchors(page):
    found, seen, fence = set(), {}, False
    for line in page.read_text(encoding='utf-8').splitlines():
        if line.lstrip().startswith('```'):
            fence = not fence
        heading = None if fence else re.match(r'^#{1,6} (.*)', line)
        if heading:
            anchor = slug(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f'{anchor}-{count}')
    return found


def links(page):
    text = re.sub(r'^\s*```.*?^\s*```', '', page.read_text(encoding='utf-8'), flags=re.M | re.S)
    targets = re.findall(r'\]\(([^)\s]+)\)', text) + re.findall(r'href="([^"]+)"', text)
    return [target for target in targets if not re.match(r'[a-z]+:', target)]


@pytest.mark.parametrize('page', PAGES, ids=name)
def test_links_and_images_resolve(page):
    for target in links(page):
        path, _, anchor = target.partition('#')
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f'{name(page)}: {target} names no file'
        if anchor:
            assert anchor in anchors(file), f'{name(page)}: {target}: no heading of {file.name} has this anchor'


def test_the_readme_is_an_index_of_at_most_600_lines():
    assert len(README.read_text(encoding='utf-8').splitlines()) <= 600


def test_the_readme_gives_the_ci_test_command():
    command = "pip install torch==2.13.0 -e '.[test]' && pytest"
    assert command in (ROOT / '.ci' / 'run').read_text(encoding='utf-8')
    assert f'```bash\n{command}\n```' in readme_section('Set-up commands')
