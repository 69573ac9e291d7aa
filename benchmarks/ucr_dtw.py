"""The 1-NN DTW baseline on the UCR/UEA sets the table of docs/signals.md uses.

Full-window dynamic time warping with one nearest neighbour, the standard baseline of the UCR
archive (Dau et al., "The UCR Time Series Archive", arXiv 1810.07758) and of the UEA multivariate
archive (Bagnall et al., arXiv 1811.00075), computed here with aeon's
`KNeighborsTimeSeriesClassifier(distance='dtw')` (k=1, no warping window) on the archive's own
train/test split, the one `vit_pytorch.ucr.load_ucr` returns. No data is downloaded: the sets
ship inside the aeon package. Needs the `timeseries` extra (aeon, Python >= 3.11):

    python benchmarks/ucr_dtw.py                      # all six sets
    python benchmarks/ucr_dtw.py GunPoint ArrowHead --json dtw.json
"""

import argparse
import json
import time

from vit_pytorch.ucr import DATASETS, load_classification


def dtw_accuracy(name):
    """Test accuracy of full-window 1-NN DTW on `name`, and the seconds it took."""
    from aeon.classification.distance_based import KNeighborsTimeSeriesClassifier

    load = load_classification()           # the archive's split, as vit_pytorch.ucr.load_ucr reads it
    (train_series, train_labels), (test_series, test_labels) = load(name, split='train'), load(name, split='test')
    start = time.perf_counter()
    classifier = KNeighborsTimeSeriesClassifier(n_neighbors=1, distance='dtw')
    classifier.fit(train_series, train_labels)
    accuracy = float((classifier.predict(test_series) == test_labels).mean())
    return accuracy, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('names', nargs='*', default=list(DATASETS), help='data sets (default: all six)')
    parser.add_argument('--json', help='also write the accuracies to this file')
    args = parser.parse_args()
    results = {}
    for name in args.names:
        accuracy, seconds = dtw_accuracy(name)
        results[name] = accuracy
        print(f'{name:18s} 1-NN DTW test accuracy {accuracy:.4f}  ({seconds:.0f} s)', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=2)


if __name__ == '__main__':
    main()
