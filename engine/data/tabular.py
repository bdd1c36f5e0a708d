"""Tabular fairness benchmarks: adult, bank, credit_default, german_credit, law_school.

Common preprocessing (:func:`encode`): a scikit-learn ``ColumnTransformer`` with
``OneHotEncoder(handle_unknown="ignore")`` on the categorical columns and ``StandardScaler`` on the
numeric ones, fitted on the (full) training split only and applied to both splits. The target is
never a feature. Sensitive attributes are *kept* as features as well (they are also returned as
strings in ``sensitive_*``), so "fairness through unawareness" is not applied here. Note that the
scaler/encoder statistics come from the training data and are not privatised.

Binary labels: 1 = adult income >50K, bank subscribed (y=yes), credit default next month,
german bad credit (class 2), law school passed the bar on the first try (first_pf=1).
Splits: adult uses the official train/test files; the others use
``train_test_split(test_size=0.2, stratify=y, random_state=0)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import io
from pathlib import Path

import numpy as np

from .base import DataError, RawData
from .files import ASSETS_DIR, KNOWN_FILES, locate_files, read_verified

if TYPE_CHECKING:
    import pandas as pd

SPLIT_SEED = 0


def encode(train: pd.DataFrame, test: pd.DataFrame, categorical: list[str], numeric: list[str]):
    """Fit the one-hot + standard-scaler transform on ``train``; return (x_train, x_test, names)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    train = train.copy()
    test = test.copy()
    for c in categorical:
        train[c] = train[c].astype(str)
        test[c] = test[c].astype(str)
    for c in numeric:
        train[c] = train[c].astype(np.float64)
        test[c] = test[c].astype(np.float64)
    ct = ColumnTransformer(
        [
            ("cat", OneHotEncoder(handle_unknown="ignore", sparse_output=False), categorical),
            ("num", StandardScaler(), numeric),
        ],
        sparse_threshold=0.0,
        verbose_feature_names_out=False,
    )
    xtr = np.ascontiguousarray(ct.fit_transform(train), dtype=np.float32)
    xte = np.ascontiguousarray(ct.transform(test), dtype=np.float32)
    return xtr, xte, [str(n) for n in ct.get_feature_names_out()]


def _read(dataset: str, root: Path, folder: str, names: list[str], fallback=()) -> list[bytes]:
    kfs = [KNOWN_FILES[f"{folder}/{n}"] for n in names]
    paths = locate_files(dataset, root, folder, kfs, fallback_dirs=tuple(fallback))
    return [read_verified(p, kf) for p, kf in zip(paths, kfs)]


def _split_frame(df: pd.DataFrame, y: np.ndarray):
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(df))
    tr, te = train_test_split(idx, test_size=0.2, stratify=y, random_state=SPLIT_SEED)
    return np.sort(tr), np.sort(te)


def _raw(df, y, tr, te, categorical, numeric, sensitive: dict[str, np.ndarray], class_names, **meta) -> RawData:
    xtr, xte, names = encode(df.iloc[tr], df.iloc[te], categorical, numeric)
    return RawData(
        x_train=xtr, y_train=y[tr].astype(np.int64), x_test=xte, y_test=y[te].astype(np.int64),
        class_names=class_names,
        sensitive_train={k: np.asarray(v)[tr].astype(str) for k, v in sensitive.items()},
        sensitive_test={k: np.asarray(v)[te].astype(str) for k, v in sensitive.items()},
        feature_names=names,
        meta={"categorical": list(categorical), "numeric": list(numeric), **meta},
    )


# --------------------------------------------------------------------------- adult
ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
]
ADULT_CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                     "native-country"]
ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


def _adult_frame(raw: bytes, skip_first: bool, where: str) -> pd.DataFrame:
    import pandas as pd

    df = pd.read_csv(
        io.BytesIO(raw), header=None, names=ADULT_COLUMNS, skipinitialspace=True, na_values=["?"],
        skiprows=1 if skip_first else 0, skip_blank_lines=True, dtype={c: str for c in ADULT_CATEGORICAL},
    )
    df = df.dropna().reset_index(drop=True)  # drop the rows with '?'
    income = df["income"].astype(str).str.strip().str.rstrip(".")
    if not income.isin(["<=50K", ">50K"]).all():
        raise DataError(f"{where}: unexpected income values {sorted(set(income) - {'<=50K', '>50K'})[:5]}")
    df["income"] = (income == ">50K").astype(np.int64)
    return df


def load_adult_raw(root: Path) -> RawData:
    import pandas as pd

    train_raw, test_raw = _read("adult", root, "adult", ["adult.data.gz", "adult.test.gz"],
                                fallback=[ASSETS_DIR / "adult"])
    tr = _adult_frame(train_raw, False, "adult.data")
    te = _adult_frame(test_raw, True, "adult.test")
    df = pd.concat([tr, te], ignore_index=True)
    y = df["income"].to_numpy()
    itr, ite = np.arange(len(tr)), np.arange(len(tr), len(df))
    return _raw(df, y, itr, ite, ADULT_CATEGORICAL, ADULT_NUMERIC,
                {"sex": df["sex"].to_numpy(), "race": df["race"].to_numpy()}, ["<=50K", ">50K"])


# --------------------------------------------------------------------------- bank
BANK_CATEGORICAL = ["job", "marital", "education", "default", "housing", "loan", "contact", "month", "poutcome"]
BANK_NUMERIC = ["age", "balance", "day", "duration", "campaign", "pdays", "previous"]


def bank_age_group(age) -> np.ndarray:
    age = np.asarray(age)
    return np.where(age < 25, "<25", np.where(age > 60, ">60", "25-60"))


def load_bank_raw(root: Path) -> RawData:
    import pandas as pd

    (raw,) = _read("bank", root, "bank_marketing", ["bank-full.csv.gz"])
    df = pd.read_csv(io.BytesIO(raw), sep=";")
    if not df["y"].isin(["yes", "no"]).all():
        raise DataError("bank-full.csv: column y must be yes/no.")
    y = (df["y"] == "yes").to_numpy().astype(np.int64)
    tr, te = _split_frame(df, y)
    return _raw(df, y, tr, te, BANK_CATEGORICAL, BANK_NUMERIC,
                {"age_group": bank_age_group(df["age"].to_numpy())}, ["no", "yes"])


# --------------------------------------------------------------------------- credit_default
CREDIT_TARGET = "default payment next month"
CREDIT_CATEGORICAL = ["SEX", "EDUCATION", "MARRIAGE"]
CREDIT_NUMERIC = ["LIMIT_BAL", "AGE", "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6"] + [
    f"BILL_AMT{i}" for i in range(1, 7)] + [f"PAY_AMT{i}" for i in range(1, 7)]


def load_credit_default_raw(root: Path) -> RawData:
    import pandas as pd

    (raw,) = _read("credit_default", root, "credit_default", ["default_of_credit_card_clients.csv.gz"])
    df = pd.read_csv(io.BytesIO(raw)).drop(columns=["ID"])
    y = df[CREDIT_TARGET].to_numpy().astype(np.int64)
    sex = df["SEX"].map({1: "male", 2: "female"})
    if sex.isna().any():
        raise DataError("default_of_credit_card_clients.csv: SEX must be 1 or 2.")
    tr, te = _split_frame(df, y)
    return _raw(df, y, tr, te, CREDIT_CATEGORICAL, CREDIT_NUMERIC, {"sex": sex.to_numpy()},
                ["no default", "default"])


# --------------------------------------------------------------------------- german_credit
GERMAN_COLUMNS = [
    "status", "duration", "credit_history", "purpose", "credit_amount", "savings", "present_employment",
    "installment_rate", "status_sex", "other_debtors", "present_residence_since", "property", "age",
    "installment_plans", "housing", "number_of_existing_credits", "job", "number_of_people_liable_for",
    "telephone", "foreign_worker", "credit",
]
GERMAN_NUMERIC = ["duration", "credit_amount", "installment_rate", "present_residence_since", "age",
                  "number_of_existing_credits", "number_of_people_liable_for"]
GERMAN_CATEGORICAL = [c for c in GERMAN_COLUMNS if c not in GERMAN_NUMERIC and c != "credit"]
GERMAN_SEX = {"A91": "male", "A92": "female", "A93": "male", "A94": "male", "A95": "female"}


def load_german_credit_raw(root: Path) -> RawData:
    import pandas as pd

    (raw,) = _read("german_credit", root, "german_credit", ["german.data.gz"])
    df = pd.read_csv(io.BytesIO(raw), sep=r"\s+", header=None, names=GERMAN_COLUMNS)
    if not df["credit"].isin([1, 2]).all():
        raise DataError("german.data: class column must be 1 (good) or 2 (bad).")
    y = (df["credit"] == 2).to_numpy().astype(np.int64)  # 1 = bad credit
    sex = df["status_sex"].map(GERMAN_SEX)
    if sex.isna().any():
        raise DataError("german.data: unknown personal-status code.")
    age_group = np.where(df["age"].to_numpy() <= 25, "<=25", ">25")
    tr, te = _split_frame(df, y)
    return _raw(df, y, tr, te, GERMAN_CATEGORICAL, GERMAN_NUMERIC,
                {"sex": sex.to_numpy(), "age_group": age_group}, ["good", "bad"])


# --------------------------------------------------------------------------- law_school
LAW_CATEGORICAL = ["race", "sex", "region_first"]
LAW_NUMERIC = ["LSAT", "UGPA", "sander_index"]


def load_law_school_raw(root: Path) -> RawData:
    import pandas as pd

    (raw,) = _read("law_school", root, "law_school", ["law_data.csv.gz"])
    df = pd.read_csv(io.BytesIO(raw), index_col=0)
    df = df.drop(columns=["ZFYA"])  # first-year grade: an outcome, not a pre-admission feature
    if not df["first_pf"].isin([0.0, 1.0]).all():
        raise DataError("law_data.csv: first_pf must be 0.0 or 1.0.")
    y = (df["first_pf"] == 1.0).to_numpy().astype(np.int64)
    # Sex is coded 1/2 with no documented mapping in the source: kept as the strings "1"/"2".
    sex = df["sex"].astype(int).astype(str).to_numpy()
    race = df["race"].astype(str).to_numpy()
    df = df.assign(sex=sex, race=race)
    tr, te = _split_frame(df, y)
    return _raw(df, y, tr, te, LAW_CATEGORICAL, LAW_NUMERIC, {"race": race, "sex": sex}, ["fail", "pass"])
